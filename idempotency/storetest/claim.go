package storetest

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

func claimChecks() []check {
	return []check{
		{name: "Claim/New", run: testClaimNew},
		{name: "Claim/InFlight", run: testClaimInFlight},
		{name: "Claim/FingerprintRoundTrip", run: testFingerprintRoundTrip},
		{name: "Claim/InFlightOtherVersion", run: testClaimInFlightOtherVersion},
		{name: "Claim/Duplicate", run: testClaimDuplicate},
		{name: "Claim/DuplicateOtherVersion", run: testClaimDuplicateOtherVersion},
		{name: "Claim/MismatchCompleted", run: testClaimMismatchCompleted},
		{name: "Claim/MismatchInFlight", run: testClaimMismatchInFlight},
		{name: "Claim/MismatchReleased", run: testClaimMismatchReleased},
		{name: "Claim/Reclaimed", run: testClaimReclaimed},
		{name: "Claim/RenewedIsNotReclaimed", run: testRenewedNotReclaimed},
		{name: "Claim/AfterRelease", run: testClaimAfterRelease},
		{name: "Claim/AfterDelete", run: testClaimAfterDelete},
		{name: "Claim/OneOwnerOf64", run: testOneOwnerOf64},
		{name: "Steps/KeptOnReleaseAndReclaim", run: testStepsCarryOver},
		{name: "Steps/EmptyAndOverwritten", run: testStepsEmptyAndOverwritten},
		{name: "Complete/BinaryResult", run: testBinaryResult},
		{name: "Get/Absent", run: testGetAbsent},
		{name: "Delete", run: testDelete},
		{name: "Ping", run: testPing},
	}
}

func testClaimNew(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if c.Fence < 1 || c.Attempts != 1 {
		t.Errorf("first claim: fence %d attempts %d, want a positive fence and 1", c.Fence, c.Attempts)
	}
	if len(c.Steps) != 0 {
		t.Errorf("first claim has steps %v", c.Steps)
	}
	rec := mustGet(t, s, key)
	if rec.State != idempotency.StateClaimed || rec.Token != c.Token || rec.Fence != c.Fence || rec.Attempts != 1 ||
		rec.Fingerprint != fp("a") || rec.FingerprintVersion != 1 || rec.Released {
		t.Errorf("stored record %+v does not match the claim %+v", rec, c)
	}
	if !rec.LeaseUntil.Equal(c.LeaseUntil) {
		t.Errorf("record lease %v, claim lease %v", rec.LeaseUntil, c.LeaseUntil)
	}
	if got := rec.LeaseUntil.Sub(rec.ClaimedAt); got != longLease {
		t.Errorf("lease_until - claimed_at = %s, want the lease %s", got, longLease)
	}
	if rec.ClaimedAt.IsZero() || !rec.CompletedAt.IsZero() {
		t.Errorf("claimed_at %v completed_at %v", rec.ClaimedAt, rec.CompletedAt)
	}
	other := mustOwn(t, s, req(newKey(t), fp("a"), longLease), idempotency.ClaimNew)
	if other.Token == c.Token {
		t.Errorf("two claims share token %s", c.Token)
	}
}

func testClaimInFlight(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	before := mustGet(t, s, key)
	rec := mustNotOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimInFlight)
	if rec.Token != c.Token || rec.State != idempotency.StateClaimed || rec.Fence != c.Fence {
		t.Errorf("IN_FLIGHT record %+v, want the live claim %+v", rec, c)
	}
	unchanged(t, s, before, "an IN_FLIGHT claim")
	mustComplete(t, s, c, "r")
}

// Fingerprints are opaque strings: any bytes survive storage unchanged and
// compare equal to themselves.
func testFingerprintRoundTrip(t *testing.T, h *Harness) {
	s := h.Store
	for _, f := range []string{"1:\"quoted\" \\ / é ✓ \x01\n\t", "", "1:" + string(make([]byte, 300))} {
		key := newKey(t)
		c := mustOwn(t, s, req(key, f, longLease), idempotency.ClaimNew)
		if rec := mustGet(t, s, key); rec.Fingerprint != f {
			t.Errorf("fingerprint %q stored as %q", f, rec.Fingerprint)
		}
		mustNotOwn(t, s, req(key, f, longLease), idempotency.ClaimInFlight)
		if !release(t, s, key, c.Token, time.Minute) {
			t.Fatal("Release = false")
		}
		c2 := mustOwn(t, s, req(key, f, longLease), idempotency.ClaimNew)
		mustComplete(t, s, c2, "r")
		if rec := mustNotOwn(t, s, req(key, f, longLease), idempotency.ClaimDuplicate); rec.Fingerprint != f {
			t.Errorf("fingerprint %q completed as %q", f, rec.Fingerprint)
		}
	}
}

func testClaimInFlightOtherVersion(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	r := req(key, "2:other", longLease)
	r.FingerprintVersion = 2
	mustNotOwn(t, s, r, idempotency.ClaimInFlight)
}

func testClaimDuplicate(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	comp := completion(c, "the result")
	comp.Meta = map[string]string{"k": "v", "unicode": "é✓"}
	if !complete1(t, s, comp) {
		t.Fatal("Complete with the owning token = false")
	}
	rec := mustNotOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimDuplicate)
	if rec.State != idempotency.StateCompleted || string(rec.Result) != "the result" ||
		rec.Outcome != idempotency.RecordOutcomeOK || rec.Meta["k"] != "v" || rec.Meta["unicode"] != "é✓" ||
		rec.Fence != c.Fence || rec.Attempts != 1 || rec.Token != c.Token || rec.CompletedAt.IsZero() {
		t.Errorf("DUPLICATE record %+v", rec)
	}
	if rec.CompletedAt.Before(rec.ClaimedAt) {
		t.Errorf("completed_at %v before claimed_at %v", rec.CompletedAt, rec.ClaimedAt)
	}
	if d := sameRecord(rec, mustGet(t, s, key)); d != "" {
		t.Errorf("DUPLICATE record differs from Get: %s", d)
	}

	// A dead-lettered completion is a duplicate too, with its outcome.
	key2 := newKey(t)
	c2 := mustOwn(t, s, req(key2, fp("b"), longLease), idempotency.ClaimNew)
	dl := completion(c2, "")
	dl.Outcome, dl.Result = idempotency.RecordOutcomeDeadLettered, nil
	if !complete1(t, s, dl) {
		t.Fatal("Complete(dead_lettered) = false")
	}
	rec2 := mustNotOwn(t, s, req(key2, fp("b"), longLease), idempotency.ClaimDuplicate)
	if rec2.Outcome != idempotency.RecordOutcomeDeadLettered || len(rec2.Result) != 0 {
		t.Errorf("dead-lettered record: outcome %q result %q", rec2.Outcome, rec2.Result)
	}
}

func testClaimDuplicateOtherVersion(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	mustComplete(t, s, c, "r")
	r := req(key, "2:entirely-different", longLease)
	r.FingerprintVersion = 2
	rec := mustNotOwn(t, s, r, idempotency.ClaimDuplicate)
	if rec.Fingerprint != fp("a") || rec.FingerprintVersion != 1 {
		t.Errorf("record fingerprint %q v%d, want the stored one", rec.Fingerprint, rec.FingerprintVersion)
	}
}

func testClaimMismatchCompleted(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	mustComplete(t, s, c, "r")
	before := mustGet(t, s, key)
	rec := mustNotOwn(t, s, req(key, fp("b"), longLease), idempotency.ClaimMismatch)
	if rec.Fingerprint != fp("a") || rec.State != idempotency.StateCompleted {
		t.Errorf("MISMATCH record %+v, want the stored one", rec)
	}
	unchanged(t, s, before, "a MISMATCH claim")
	mustNotOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimDuplicate)
}

func testClaimMismatchInFlight(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	before := mustGet(t, s, key)
	rec := mustNotOwn(t, s, req(key, fp("b"), longLease), idempotency.ClaimMismatch)
	if rec.Token != c.Token {
		t.Errorf("MISMATCH record token %q, want the owner's", rec.Token)
	}
	unchanged(t, s, before, "a MISMATCH claim")
	mustComplete(t, s, c, "r") // the owner is undisturbed
}

// A released (or expired) claim's steps belong to its content: a claim with
// another fingerprint of the same version is a MISMATCH, not a new owner that
// would replay them.
func testClaimMismatchReleased(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if !saveStep(t, s, key, c.Token, "charge", []byte("charged a")) {
		t.Fatal("SaveStep = false")
	}
	if !release(t, s, key, c.Token, time.Minute) {
		t.Fatal("Release = false")
	}
	before := mustGet(t, s, key)
	mustNotOwn(t, s, req(key, fp("b"), longLease), idempotency.ClaimMismatch)
	unchanged(t, s, before, "a MISMATCH claim of a released record")
	c2 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if string(c2.Steps["charge"]) != "charged a" {
		t.Errorf("steps %v after the mismatch, want charge kept", c2.Steps)
	}
}

func testClaimReclaimed(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c1 := mustOwn(t, s, req(key, fp("a"), shortLease), idempotency.ClaimNew)
	if !saveStep(t, s, key, c1.Token, "s1", []byte("one")) {
		t.Fatal("SaveStep = false")
	}
	mustNotOwn(t, s, req(key, fp("a"), shortLease), idempotency.ClaimInFlight)
	time.Sleep(expiry) // let the lease run out on the server's clock
	c2 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimReclaimed)
	if c2.Fence <= c1.Fence || c2.Attempts != 2 {
		t.Errorf("reclaim: fence %d attempts %d, want a fence above %d and 2", c2.Fence, c2.Attempts, c1.Fence)
	}
	if c2.Token == c1.Token {
		t.Error("reclaim kept the old token")
	}
	if string(c2.Steps["s1"]) != "one" {
		t.Errorf("reclaim steps %v, want s1=one kept", c2.Steps)
	}
	if !c2.LeaseUntil.After(c1.LeaseUntil) {
		t.Errorf("reclaimed lease %v not after the expired one %v", c2.LeaseUntil, c1.LeaseUntil)
	}
	// The old owner is fenced off, the new one completes.
	if complete1(t, s, completion(c1, "stale")) {
		t.Error("Complete by the reclaimed-from owner = true")
	}
	mustComplete(t, s, c2, "fresh")
	if rec := mustGet(t, s, key); string(rec.Result) != "fresh" || rec.Fence != c2.Fence {
		t.Errorf("record after reclaim: result %q fence %d, want fresh and %d", rec.Result, rec.Fence, c2.Fence)
	}
}

func testRenewedNotReclaimed(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), shortLease), idempotency.ClaimNew)
	until, ok := renew(t, s, key, c.Token, longLease)
	if !ok {
		t.Fatal("Renew by the owner = false")
	}
	if until.Sub(c.LeaseUntil) < longLease-shortLease {
		t.Errorf("renewed lease ends %v, want about %s after the claim's %v", until, longLease, c.LeaseUntil)
	}
	if rec := mustGet(t, s, key); !rec.LeaseUntil.Equal(until) || rec.Fence != c.Fence {
		t.Errorf("stored lease %v fence %d, want %v and the claim's %d", rec.LeaseUntil, rec.Fence, until, c.Fence)
	}
	time.Sleep(expiry) // past the original lease, inside the renewed one
	mustNotOwn(t, s, req(key, fp("a"), shortLease), idempotency.ClaimInFlight)
}

func testClaimAfterRelease(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c1 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if !release(t, s, key, c1.Token, time.Minute) {
		t.Fatal("Release by the owner = false")
	}
	rec := mustGet(t, s, key)
	if rec.State != idempotency.StateClaimed || !rec.Released || rec.Fence != c1.Fence || rec.Attempts != 1 {
		t.Errorf("released record %+v, want CLAIMED, released, fence %d, attempts 1", rec, c1.Fence)
	}
	c2 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if c2.Fence <= c1.Fence || c2.Attempts != 2 || c2.Token == c1.Token {
		t.Errorf("claim after release: fence %d attempts %d, want a fence above %d, 2 and a new token", c2.Fence, c2.Attempts, c1.Fence)
	}
	if rec := mustGet(t, s, key); rec.Released || rec.Token != c2.Token {
		t.Errorf("record after re-claim: released %v token %q", rec.Released, rec.Token)
	}
	mustNotOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimInFlight)
	if saveStep(t, s, key, c1.Token, "late", nil) {
		t.Error("SaveStep by the released owner = true")
	}
	mustComplete(t, s, c2, "r")
}

func testClaimAfterDelete(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	mustComplete(t, s, c, "r")
	if existed, err := s.Delete(ctxT(t), key); err != nil || !existed {
		t.Fatalf("Delete = %v, %v; want true", existed, err)
	}
	// The record is gone, attempts start again; the fence does not: a
	// downstream system that saw the old owner's fence must reject it.
	c2 := mustOwn(t, s, req(key, fp("b"), longLease), idempotency.ClaimNew)
	if c2.Fence <= c.Fence || c2.Attempts != 1 {
		t.Errorf("claim after Delete: fence %d attempts %d, want a fence above %d and a fresh 1", c2.Fence, c2.Attempts, c.Fence)
	}
}

func testOneOwnerOf64(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	const n = 64
	results := make([]idempotency.ClaimResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := s.Claim(ctxT(t), []idempotency.ClaimRequest{req(key, fp("a"), longLease)})
			if err == nil && len(res) == 1 {
				results[i] = res[0]
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	var owner *idempotency.Claim
	for i, res := range results {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		switch res.Outcome {
		case idempotency.ClaimNew:
			if owner != nil {
				t.Fatalf("two owners: %s and %s", owner.Token, res.Claim.Token)
			}
			owner = res.Claim
		case idempotency.ClaimInFlight:
		default:
			t.Fatalf("claim %d: outcome %s", i, res.Outcome)
		}
	}
	if owner == nil {
		t.Fatal("no owner among 64 claims")
	}
	for i, res := range results {
		if res.Outcome == idempotency.ClaimInFlight && res.Record.Token != owner.Token {
			t.Errorf("claim %d saw IN_FLIGHT under token %q, the owner is %q", i, res.Record.Token, owner.Token)
		}
	}
	if rec := mustGet(t, s, key); rec.Token != owner.Token || rec.Fence != owner.Fence {
		t.Errorf("stored token %q fence %d, want the owner's (fence %d)", rec.Token, rec.Fence, owner.Fence)
	}
}

func testStepsCarryOver(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c1 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	for name, v := range map[string]string{"charge": "ch_1", "email": "sent"} {
		if !saveStep(t, s, key, c1.Token, name, []byte(v)) {
			t.Fatalf("SaveStep(%s) by the owner = false", name)
		}
	}
	if rec := mustGet(t, s, key); string(rec.Steps["charge"]) != "ch_1" || string(rec.Steps["email"]) != "sent" {
		t.Errorf("stored steps %v", rec.Steps)
	}
	if !release(t, s, key, c1.Token, time.Minute) {
		t.Fatal("Release = false")
	}
	c2 := mustOwn(t, s, req(key, fp("a"), shortLease), idempotency.ClaimNew)
	if string(c2.Steps["charge"]) != "ch_1" || string(c2.Steps["email"]) != "sent" || len(c2.Steps) != 2 {
		t.Errorf("steps after release: %v", c2.Steps)
	}
	if !saveStep(t, s, key, c2.Token, "ship", []byte("trk")) {
		t.Fatal("SaveStep by the second owner = false")
	}
	time.Sleep(expiry)
	c3 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimReclaimed)
	if len(c3.Steps) != 3 || string(c3.Steps["ship"]) != "trk" || string(c3.Steps["charge"]) != "ch_1" {
		t.Errorf("steps after reclaim: %v", c3.Steps)
	}
	if c2.Fence <= c1.Fence || c3.Fence <= c2.Fence || c3.Attempts != 3 {
		t.Errorf("fences %d, %d, %d and third attempts %d: want strictly increasing fences and 3", c1.Fence, c2.Fence, c3.Fence, c3.Attempts)
	}
	mustComplete(t, s, c3, "done")
	if rec := mustGet(t, s, key); len(rec.Steps) != 3 {
		t.Errorf("completed record steps %v, want the 3 kept", rec.Steps)
	}
}

func testStepsEmptyAndOverwritten(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c1 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if !saveStep(t, s, key, c1.Token, "empty", nil) || !saveStep(t, s, key, c1.Token, "twice", []byte("1")) ||
		!saveStep(t, s, key, c1.Token, "twice", []byte("2")) {
		t.Fatal("SaveStep by the owner = false")
	}
	if !release(t, s, key, c1.Token, 0) {
		t.Fatal("Release = false")
	}
	c2 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if v, ok := c2.Steps["empty"]; !ok || len(v) != 0 {
		t.Errorf("a step with an empty result must be present and empty: %q present %v", v, ok)
	}
	if string(c2.Steps["twice"]) != "2" {
		t.Errorf("a step saved twice holds %q, want the last", c2.Steps["twice"])
	}
}

func testBinaryResult(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	all := make([]byte, 512)
	for i := range all {
		all[i] = byte(i)
	}
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if !saveStep(t, s, key, c.Token, "bin", all) {
		t.Fatal("SaveStep = false")
	}
	comp := completion(c, "")
	comp.Result = all
	if !complete1(t, s, comp) {
		t.Fatal("Complete = false")
	}
	rec := mustGet(t, s, key)
	if !bytes.Equal(rec.Result, all) || !bytes.Equal(rec.Steps["bin"], all) {
		t.Errorf("binary result or step did not round-trip: %d / %d bytes", len(rec.Result), len(rec.Steps["bin"]))
	}
}

func testGetAbsent(t *testing.T, h *Harness) {
	if rec := get(t, h.Store, newKey(t)); rec != nil {
		t.Errorf("Get of a key never claimed = %+v", rec)
	}
}

func testDelete(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	if existed, err := s.Delete(ctxT(t), key); err != nil || existed {
		t.Fatalf("Delete of an absent key = %v, %v; want false", existed, err)
	}
	mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if existed, err := s.Delete(ctxT(t), key); err != nil || !existed {
		t.Fatalf("Delete of a claimed key = %v, %v; want true", existed, err)
	}
	if rec := get(t, s, key); rec != nil {
		t.Errorf("Get after Delete = %+v", rec)
	}
}

func testPing(t *testing.T, h *Harness) {
	if err := h.Store.Ping(ctxT(t)); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
