package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

func batchChecks() []check {
	return []check{
		{name: "Batch/MixedOutcomes", run: testBatchMixed},
		{name: "Batch/Large", run: testBatchLarge},
		{name: "Batch/PerKeyFailure", run: testBatchPerKeyFailure, needs: func(h *Harness) bool { return h.BrokenKey != nil }},
	}
}

// A batch with a key the store cannot write: on a store that splits
// batches over servers, that key fails alone (a BatchError holding its
// error) and the others are claimed and completed; otherwise the whole call
// may fail, but then as the store being unavailable, with no results.
func testBatchPerKeyFailure(t *testing.T, h *Harness) {
	s := h.Store
	const n = 12
	broken := n / 2
	reqs := make([]idempotency.ClaimRequest, n)
	for i := range reqs {
		k := newKey(t)
		if i == broken {
			k = h.BrokenKey(t)
		}
		reqs[i] = req(k, fp("a"), longLease)
	}
	res, err := s.Claim(ctxT(t), reqs)
	if err == nil {
		t.Fatalf("Claim of a batch with a key the store cannot write: no error")
	}
	if !errors.Is(err, idempotency.ErrStoreUnavailable) {
		t.Fatalf("Claim of a batch with a key the store cannot write: %v, want an error wrapping ErrStoreUnavailable", err)
	}
	var be *idempotency.BatchError
	if !errors.As(err, &be) {
		if h.SplitBatches {
			t.Fatalf("Claim: the whole batch failed (%v); want an idempotency.BatchError failing the broken key alone", err)
		}
		return
	}
	if len(be.Errs) != n || len(res) != n {
		t.Fatalf("Claim: BatchError of %d errors and %d results for %d keys", len(be.Errs), len(res), n)
	}
	if !errors.Is(be.Errs[broken], idempotency.ErrStoreUnavailable) {
		t.Fatalf("Claim: the broken key's error is %v, want one wrapping ErrStoreUnavailable", be.Errs[broken])
	}
	var cs []idempotency.Completion
	for i, kerr := range be.Errs {
		switch {
		case i == broken:
		case kerr != nil && h.SplitBatches:
			t.Errorf("Claim: key %d failed with %v; only the broken key may", i, kerr)
		case kerr != nil:
		case res[i].Outcome != idempotency.ClaimNew || res[i].Claim == nil || res[i].Claim.Key != reqs[i].Key:
			t.Errorf("Claim: key %d: %s %+v, want a NEW claim of %s", i, res[i].Outcome, res[i].Claim, reqs[i].Key)
		default:
			cs = append(cs, completion(res[i].Claim, fmt.Sprint("result ", i)))
		}
	}
	if len(cs) == 0 {
		t.Fatal("Claim: no key of the batch succeeded beside the broken one")
	}
	// The broken key's completion amid the others'.
	at := len(cs) / 2
	cs = append(cs[:at], append([]idempotency.Completion{{Key: reqs[broken].Key, Token: "ffffffffffffffffffffffffffffffff", Outcome: idempotency.RecordOutcomeOK, Retention: retention}}, cs[at:]...)...)
	ok, err := s.Complete(ctxT(t), cs)
	if !errors.As(err, &be) || !errors.Is(err, idempotency.ErrStoreUnavailable) || len(be.Errs) != len(cs) || len(ok) != len(cs) {
		t.Fatalf("Complete of a batch with a key the store cannot write = %v, %v; want %d results and a BatchError", ok, err, len(cs))
	}
	if be.Errs[at] == nil {
		t.Errorf("Complete: the broken key's completion did not fail")
	}
	for i, c := range cs {
		if i == at {
			continue
		}
		if be.Errs[i] != nil || !ok[i] {
			t.Errorf("Complete: completion %d (%s) = %v, %v; want true", i, c.Result, ok[i], be.Errs[i])
			continue
		}
		if rec := mustGet(t, s, c.Key); rec.State != idempotency.StateCompleted || string(rec.Result) != string(c.Result) {
			t.Errorf("%s after the batch Complete: %+v", c.Result, rec)
		}
	}
}

// One batch meets every claim outcome, in request order.
func testBatchMixed(t *testing.T, h *Harness) {
	s := h.Store
	type kase struct {
		name string
		req  idempotency.ClaimRequest
		want idempotency.ClaimOutcome
		// above: an owned claim's fence must exceed it (the key's last
		// fence, 0 for none); token: a stored record's
		above int64
		token string
	}
	var cases []kase
	add := func(name string, r idempotency.ClaimRequest, want idempotency.ClaimOutcome, above int64, token string) {
		cases = append(cases, kase{name, r, want, above, token})
	}

	add("new", req(newKey(t), fp("a"), longLease), idempotency.ClaimNew, 0, "")

	dup := newKey(t)
	cd := mustOwn(t, s, req(dup, fp("a"), longLease), idempotency.ClaimNew)
	mustComplete(t, s, cd, "dup")
	add("duplicate", req(dup, fp("a"), longLease), idempotency.ClaimDuplicate, 0, cd.Token)

	mis := newKey(t)
	cm := mustOwn(t, s, req(mis, fp("a"), longLease), idempotency.ClaimNew)
	mustComplete(t, s, cm, "mis")
	add("mismatch", req(mis, fp("other"), longLease), idempotency.ClaimMismatch, 0, cm.Token)

	inf := newKey(t)
	ci := mustOwn(t, s, req(inf, fp("a"), longLease), idempotency.ClaimNew)
	add("in flight", req(inf, fp("a"), longLease), idempotency.ClaimInFlight, 0, ci.Token)

	rel := newKey(t)
	cr := mustOwn(t, s, req(rel, fp("a"), longLease), idempotency.ClaimNew)
	if !release(t, s, rel, cr.Token, time.Minute) {
		t.Fatal("Release = false")
	}
	add("released", req(rel, fp("a"), longLease), idempotency.ClaimNew, cr.Fence, "")

	exp := newKey(t)
	ce := mustOwn(t, s, req(exp, fp("a"), shortLease), idempotency.ClaimNew)
	add("expired", req(exp, fp("a"), longLease), idempotency.ClaimReclaimed, ce.Fence, "")

	if h.SetRaw != nil {
		cor := newKey(t)
		h.SetRaw(t, cor, []byte("not a record"))
		add("corrupt", req(cor, fp("a"), longLease), idempotency.ClaimRecovered, 0, "")
	}
	for i := range 20 { // more fresh keys, spread over cluster slots
		add(fmt.Sprintf("new %d", i), req(newKey(t), fp("a"), longLease), idempotency.ClaimNew, 0, "")
	}
	// Interleave: move the fresh keys between the others.
	for i, j := 1, len(cases)-1; i < j; i, j = i+2, j-1 {
		cases[i], cases[j] = cases[j], cases[i]
	}

	time.Sleep(expiry) // let the "expired" claim's lease run out on the server's clock
	reqs := make([]idempotency.ClaimRequest, len(cases))
	for i, c := range cases {
		reqs[i] = c.req
	}
	res, err := s.Claim(ctxT(t), reqs)
	if err != nil {
		t.Fatalf("batch Claim: %v", err)
	}
	if len(res) != len(reqs) {
		t.Fatalf("batch Claim: %d results for %d requests", len(res), len(reqs))
	}
	var cs []idempotency.Completion
	for i, c := range cases {
		r := res[i]
		if r.Outcome != c.want {
			t.Errorf("%s (%d): %s, want %s", c.name, i, r.Outcome, c.want)
			continue
		}
		if r.Outcome.Owned() {
			if r.Claim == nil || r.Claim.Key != c.req.Key || r.Claim.Fence <= c.above {
				t.Errorf("%s: claim %+v, want key %s and a fence above %d", c.name, r.Claim, c.req.Key, c.above)
				continue
			}
			cs = append(cs, completion(r.Claim, c.name))
		} else if r.Record == nil || r.Record.Key != c.req.Key || r.Record.Token != c.token {
			t.Errorf("%s: record %+v, want key %s token %s", c.name, r.Record, c.req.Key, c.token)
		}
	}
	if complete1(t, s, completion(ce, "stale")) {
		t.Error("Complete by the owner whose expired claim was reclaimed in the batch = true")
	}
	// Completions in one batch: the owned claims, another owner's live
	// claim, a gone key.
	stranger := completion(ci, "stranger")
	stranger.Token = "ffffffffffffffffffffffffffffffff"
	cs = append(cs, stranger)
	cs = append(cs, idempotency.Completion{Key: newKey(t), Token: ce.Token, Outcome: idempotency.RecordOutcomeOK, Retention: retention})
	ok, err := s.Complete(ctxT(t), cs)
	if err != nil {
		t.Fatalf("batch Complete: %v", err)
	}
	for i, c := range cs {
		want := i < len(cs)-2
		if ok[i] != want {
			t.Errorf("completion %d (%s): %v, want %v", i, c.Result, ok[i], want)
		}
	}
	for _, c := range cs[:len(cs)-2] {
		if rec := mustGet(t, s, c.Key); rec.State != idempotency.StateCompleted || string(rec.Result) != string(c.Result) {
			t.Errorf("%s after batch Complete: %+v", c.Result, rec)
		}
	}
}

func testBatchLarge(t *testing.T, h *Harness) {
	s := h.Store
	const n = 300
	reqs := make([]idempotency.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = req(newKey(t), fp(fmt.Sprint(i)), longLease)
	}
	res, err := s.Claim(ctxT(t), reqs)
	if err != nil {
		t.Fatalf("Claim of %d keys: %v", n, err)
	}
	cs := make([]idempotency.Completion, n)
	for i, r := range res {
		if r.Outcome != idempotency.ClaimNew || r.Claim.Key != reqs[i].Key {
			t.Fatalf("key %d: %s %+v", i, r.Outcome, r.Claim)
		}
		cs[i] = completion(r.Claim, fmt.Sprint("result ", i))
	}
	ok, err := s.Complete(ctxT(t), cs)
	if err != nil {
		t.Fatalf("Complete of %d keys: %v", n, err)
	}
	for i, v := range ok {
		if !v {
			t.Fatalf("completion %d = false", i)
		}
	}
	res, err = s.Claim(ctxT(t), reqs)
	if err != nil {
		t.Fatalf("second Claim of %d keys: %v", n, err)
	}
	for i, r := range res {
		if r.Outcome != idempotency.ClaimDuplicate || string(r.Record.Result) != fmt.Sprint("result ", i) {
			t.Fatalf("key %d on the second claim: %s %+v (results must come back in request order)", i, r.Outcome, r.Record)
		}
	}
}
