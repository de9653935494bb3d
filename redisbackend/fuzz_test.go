package redisbackend

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"maps"
	"testing"

	"github.com/idemkit/dedupworker/idempotency"
)

// encodeRecord writes rec as the scripts of package lua do, so a
// decoded record can be written back and read again.
func encodeRecord(rec *idempotency.Record) []byte {
	m := map[string]any{
		"v": 1, "state": string(rec.State), "fp": rec.Fingerprint, "fpv": rec.FingerprintVersion,
		"token": rec.Token, "fence": rec.Fence, "attempts": rec.Attempts,
		"claimed_at_ms": rec.ClaimedAt.UnixMilli(), "lease_until_ms": rec.LeaseUntil.UnixMilli(),
	}
	if rec.Released {
		m["released"] = true
	}
	if !rec.CompletedAt.IsZero() {
		m["completed_at_ms"] = rec.CompletedAt.UnixMilli()
	}
	if rec.Outcome != "" {
		m["outcome"] = rec.Outcome
	}
	if rec.Result != nil {
		m["result"] = base64.StdEncoding.EncodeToString(rec.Result)
	}
	if rec.Meta != nil {
		m["meta"] = rec.Meta
	}
	if rec.Steps != nil {
		steps := map[string]string{}
		for k, v := range rec.Steps {
			steps[k] = base64.StdEncoding.EncodeToString(v)
		}
		m["steps"] = steps
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func recordsEqual(a, b *idempotency.Record) bool {
	return a.Key == b.Key && a.State == b.State && a.Fingerprint == b.Fingerprint &&
		a.FingerprintVersion == b.FingerprintVersion && a.Token == b.Token && a.Fence == b.Fence &&
		a.ClaimedAt.Equal(b.ClaimedAt) && a.LeaseUntil.Equal(b.LeaseUntil) && a.Released == b.Released &&
		a.CompletedAt.Equal(b.CompletedAt) && a.Outcome == b.Outcome && a.Attempts == b.Attempts &&
		bytes.Equal(a.Result, b.Result) && maps.Equal(a.Meta, b.Meta) &&
		maps.EqualFunc(a.Steps, b.Steps, bytes.Equal)
}

// FuzzDecodeRecord: decoding a stored value never panics, and whatever the
// decoder accepts as a record, written back as the scripts write it, decodes
// to the same record (no field is read one way and stored another).
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range []string{
		storedClaim,
		`{"v":1,"state":"COMPLETED","fp":"1:ab","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"completed_at_ms":3,"outcome":"ok","attempts":1,"result":"aGVsbG8=","meta":{"a":"b"},"steps":[]}`,
		`{"v":1,"state":"CLAIMED","fp":"1:x","fpv":1,"token":"t","fence":2,"claimed_at_ms":1e3,"lease_until_ms":2e3,"attempts":0,"released":true,"meta":null,"steps":{}}`,
		`{"v":1,"state":"COMPLETED","fp":"","fpv":2,"token":"","fence":-1,"claimed_at_ms":-5,"lease_until_ms":1e300,"attempts":1e19,"result":""}`,
		`{"state":"CLAIMED"}`, `{"state":"DONE","fp":"1","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":1,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"1:x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":1,"attempts":1,"steps":{"a":null}}`,
		`{"v":1,"state":"CLAIMED","fp":"1:x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":1,"attempts":1,"result":"!!"}`,
		`garbage`, `null`, `[]`, `"CLAIMED"`, `{}`, "\xff\xfe", `{"State":"CLAIMED"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		rec, ok := decodeRecord("s:k", raw)
		if !ok {
			if rec != nil {
				t.Fatalf("rejected value returned a record %+v", rec)
			}
			return
		}
		if rec == nil || rec.Key != "s:k" {
			t.Fatalf("accepted value returned %+v", rec)
		}
		if rec.State != idempotency.StateClaimed && rec.State != idempotency.StateCompleted {
			t.Fatalf("accepted a record in state %q", rec.State)
		}
		enc := encodeRecord(rec)
		again, ok := decodeRecord("s:k", enc)
		if !ok {
			t.Fatalf("re-encoded record %s does not decode (from %q)", enc, raw)
		}
		if !recordsEqual(rec, again) {
			t.Fatalf("round trip changed the record:\n first %+v\n again %+v\n (from %q via %s)", rec, again, raw, enc)
		}
	})
}
