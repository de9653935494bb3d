package storetest

import (
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

func scriptChecks() []check {
	needs := func(h *Harness) bool { return h.FlushScripts != nil }
	return []check{
		{name: "NoScript/SingleCalls", needs: needs, run: testNoScriptSingle},
		{name: "NoScript/Batches", needs: needs, run: testNoScriptBatch},
	}
}

// After the server forgets its scripts (restart, failover, SCRIPT FLUSH),
// every operation still works.
func testNoScriptSingle(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	h.FlushScripts(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	h.FlushScripts(t)
	if _, ok := renew(t, s, key, c.Token, longLease); !ok {
		t.Error("Renew after SCRIPT FLUSH = false")
	}
	h.FlushScripts(t)
	if !saveStep(t, s, key, c.Token, "s", []byte("v")) {
		t.Error("SaveStep after SCRIPT FLUSH = false")
	}
	h.FlushScripts(t)
	if !release(t, s, key, c.Token, time.Minute) {
		t.Error("Release after SCRIPT FLUSH = false")
	}
	c2 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	h.FlushScripts(t)
	mustComplete(t, s, c2, "r")
}

func testNoScriptBatch(t *testing.T, h *Harness) {
	s := h.Store
	const n = 40 // spread over many cluster slots
	reqs := make([]idempotency.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = req(newKey(t), fp("a"), longLease)
	}
	h.FlushScripts(t)
	res, err := s.Claim(ctxT(t), reqs)
	if err != nil {
		t.Fatalf("batch Claim after SCRIPT FLUSH: %v", err)
	}
	cs := make([]idempotency.Completion, n)
	for i, r := range res {
		if r.Outcome != idempotency.ClaimNew {
			t.Fatalf("key %d: %s after SCRIPT FLUSH, want NEW (did a retry run a claim twice?)", i, r.Outcome)
		}
		cs[i] = completion(r.Claim, "r")
	}
	h.FlushScripts(t)
	ok, err := s.Complete(ctxT(t), cs)
	if err != nil {
		t.Fatalf("batch Complete after SCRIPT FLUSH: %v", err)
	}
	for i, v := range ok {
		if !v {
			t.Errorf("completion %d after SCRIPT FLUSH = false (did a retry run it twice?)", i)
		}
	}
}
