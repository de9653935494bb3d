package storetest

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

func corruptChecks() []check {
	return []check{
		{name: "Corrupt/HandWrittenRecordIsRead", needs: func(h *Harness) bool { return h.SetRaw != nil }, run: testHandWrittenRecord},
		{name: "Corrupt/Recovered", needs: func(h *Harness) bool { return h.SetRaw != nil }, run: testCorruptRecovered},
		{name: "Corrupt/WrongType", needs: func(h *Harness) bool { return h.SetWrongType != nil }, run: testWrongTypeRecovered},
	}
}

// validRecord is a COMPLETED record in the Redis store's stored form, for
// hand-written values; the cases below break it one field at a time, so each
// proves the store checks that field.
func validRecord() map[string]any {
	return map[string]any{
		"v": 1, "state": "COMPLETED", "fp": fp("a"), "fpv": 1,
		"token": "0123456789abcdef0123456789abcdef", "fence": 4,
		"claimed_at_ms": 1_700_000_000_000, "lease_until_ms": 1_700_000_030_000,
		"completed_at_ms": 1_700_000_001_000, "outcome": "ok", "attempts": 2,
		"result": "aGVsbG8=", "meta": map[string]any{"k": "v"},
		"steps": map[string]any{"s": "d29ybGQ="},
	}
}

func with(field string, v any) map[string]any {
	m := validRecord()
	m[field] = v
	return m
}

func without(field string) map[string]any {
	m := validRecord()
	delete(m, field)
	return m
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The control for the corrupt cases: the untouched hand-written record, and
// variants a record may take, are read as records.
func testHandWrittenRecord(t *testing.T, h *Harness) {
	s := h.Store
	for name, m := range map[string]map[string]any{
		"complete":           validRecord(),
		"no optional fields": minimal(),
		"nulls":              nulls(),
		"empty arrays":       with("steps", []any{}),
	} {
		key := newKey(t)
		h.SetRaw(t, key, mustJSON(t, m))
		rec := get(t, s, key)
		if rec == nil {
			t.Errorf("%s: a valid record reads as absent: %s", name, mustJSON(t, m))
			continue
		}
		if rec.State != idempotency.StateCompleted || rec.Fence != 4 || rec.Fingerprint != fp("a") {
			t.Errorf("%s: read %+v", name, rec)
		}
		if name == "complete" && (string(rec.Result) != "hello" || string(rec.Steps["s"]) != "world" ||
			rec.Meta["k"] != "v" || rec.Attempts != 2 || rec.Outcome != "ok" ||
			rec.CompletedAt.UnixMilli() != 1_700_000_001_000 || rec.LeaseUntil.UnixMilli() != 1_700_000_030_000) {
			t.Errorf("complete record read as %+v", rec)
		}
		mustNotOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimDuplicate)
		mustNotOwn(t, s, req(key, fp("b"), longLease), idempotency.ClaimMismatch)
	}
}

func minimal() map[string]any {
	m := validRecord()
	for _, f := range []string{"v", "completed_at_ms", "outcome", "result", "meta", "steps"} {
		delete(m, f)
	}
	return m
}

func nulls() map[string]any {
	m := validRecord()
	for _, f := range []string{"v", "completed_at_ms", "outcome", "result", "meta", "steps", "released"} {
		m[f] = nil
	}
	return m
}

func testCorruptRecovered(t *testing.T, h *Harness) {
	s := h.Store
	// Raw bytes are stored as they are; anything else as its JSON.
	cases := map[string]any{
		"garbage":             []byte("\x00\xffnot json at all"),
		"empty":               []byte{},
		"truncated JSON":      []byte(`{"v":1,"state":"CLAIMED"`),
		"JSON array":          []any{1, 2, 3},
		"empty JSON array":    []any{},
		"array of records":    []any{validRecord()},
		"JSON null":           nil,
		"JSON number":         42,
		"JSON string":         "CLAIMED",
		"empty object":        map[string]any{},
		"unknown state":       with("state", "DONE"),
		"no state":            without("state"),
		"no token":            without("token"),
		"numeric token":       with("token", 5),
		"null token":          with("token", nil),
		"no fp":               without("fp"),
		"string fpv":          with("fpv", "1"),
		"no fence":            without("fence"),
		"no lease_until_ms":   without("lease_until_ms"),
		"string lease":        with("lease_until_ms", "soon"),
		"no claimed_at_ms":    without("claimed_at_ms"),
		"no attempts":         without("attempts"),
		"bool outcome":        with("outcome", true),
		"string released":     with("released", "yes"),
		"result not base64":   with("result", "not base64!"),
		"result a number":     with("result", 7),
		"steps an array":      with("steps", []any{"a"}),
		"steps a string":      with("steps", "a"),
		"step not base64":     with("steps", map[string]any{"s": "%%%"}),
		"step null":           with("steps", map[string]any{"s": nil}),
		"meta a number value": with("meta", map[string]any{"k": 1}),
		"meta a string":       with("meta", "k=v"),
		"fence out of range":  edited(t, `"fence":4`, `"fence":1e400`),
		"lease out of range":  edited(t, `"lease_until_ms":1700000030000`, `"lease_until_ms":-1e999`),
	}
	for name, v := range cases {
		b, ok := v.([]byte)
		if !ok {
			b = mustJSON(t, v)
		}
		key := newKey(t)
		h.SetRaw(t, key, b)
		if rec := get(t, s, key); rec != nil {
			t.Errorf("%s: Get of %q = %+v, want nil (not a record)", name, b, rec)
			continue
		}
		noneSucceeded(t, fencedWrites(t, s, key, "0123456789abcdef0123456789abcdef"), name+": on a corrupt value")
		ctx := ctxT(t)
		if rec, err := s.Wait(ctx, key, 50*time.Millisecond); err != nil || rec != nil {
			t.Errorf("%s: Wait = %+v, %v; want nil (absent)", name, rec, err)
		}
		res := claim1(t, s, req(key, fp("a"), longLease))
		if res.Outcome != idempotency.ClaimRecovered || res.Claim == nil {
			t.Errorf("%s: Claim = %s, want RECOVERED with a claim", name, res.Outcome)
			continue
		}
		if res.Claim.Fence < 1 || res.Claim.Attempts < 1 {
			t.Errorf("%s: recovered claim fence %d attempts %d", name, res.Claim.Fence, res.Claim.Attempts)
		}
		rec := mustGet(t, s, key)
		if rec.State != idempotency.StateClaimed || rec.Token != res.Claim.Token || len(rec.Steps) != 0 {
			t.Errorf("%s: record after recovery %+v", name, rec)
		}
		mustComplete(t, s, res.Claim, "r")
		mustNotOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimDuplicate)
	}
}

// edited returns the JSON of validRecord with old replaced by new, for
// values encoding/json cannot produce.
func edited(t *testing.T, old, new string) []byte {
	t.Helper()
	b := mustJSON(t, validRecord())
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("storetest: %s not in %s", old, b)
	}
	return bytes.Replace(b, []byte(old), []byte(new), 1)
}

func testWrongTypeRecovered(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	h.SetWrongType(t, key)
	if rec := get(t, s, key); rec != nil {
		t.Errorf("Get of a value of another type = %+v, want nil", rec)
	}
	noneSucceeded(t, fencedWrites(t, s, key, "0123456789abcdef0123456789abcdef"), "on a value of another type")
	if rec, err := s.Wait(ctxT(t), key, 50*time.Millisecond); err != nil || rec != nil {
		t.Errorf("Wait = %+v, %v; want nil", rec, err)
	}
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimRecovered)
	mustComplete(t, s, c, "r")
}
