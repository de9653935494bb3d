package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

func fenceChecks() []check {
	return []check{
		{name: "Fence/WrongToken", run: testFenceWrongToken},
		{name: "Fence/Completed", run: testFenceCompleted},
		{name: "Fence/Released", run: testFenceReleased},
		{name: "Fence/Gone", run: testFenceGone},
		{name: "Fence/Expired", run: testFenceExpiredStillOwned},
		{name: "Fence/GrowsAcrossExpiry", run: testFenceGrowsAcrossExpiry},
		{name: "Invalid/DuplicateKeys", run: testDuplicateKeysRejected},
		{name: "Invalid/Empty", run: testEmptyBatches},
	}
}

// fencedWrites tries every token-fenced write on key with token and
// returns which of them reported true.
func fencedWrites(t *testing.T, s idempotency.Store, key, token string) map[string]bool {
	t.Helper()
	ok := map[string]bool{}
	_, ok["Renew"] = renew(t, s, key, token, longLease)
	ok["SaveStep"] = saveStep(t, s, key, token, "x", []byte("x"))
	ok["Complete"] = complete1(t, s, idempotency.Completion{
		Key: key, Token: token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("x"), Retention: retention,
	})
	ok["Release"] = release(t, s, key, token, time.Minute)
	return ok
}

func noneSucceeded(t *testing.T, ok map[string]bool, when string) {
	t.Helper()
	for op, v := range ok {
		if v {
			t.Errorf("%s %s = true, want false", op, when)
		}
	}
}

func testFenceWrongToken(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	before := mustGet(t, s, key)
	for _, token := range []string{"00000000000000000000000000000000", "", c.Token[:len(c.Token)-1]} {
		noneSucceeded(t, fencedWrites(t, s, key, token), "with token "+token+" of another owner")
	}
	unchanged(t, s, before, "writes with a wrong token")
	// The owner still owns it: every write works, Release last.
	if _, ok := renew(t, s, key, c.Token, longLease); !ok {
		t.Error("Renew by the owner = false after others' attempts")
	}
	if !saveStep(t, s, key, c.Token, "s", []byte("v")) {
		t.Error("SaveStep by the owner = false")
	}
	if !release(t, s, key, c.Token, time.Minute) {
		t.Error("Release by the owner = false")
	}
}

func testFenceCompleted(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	mustComplete(t, s, c, "r")
	before := mustGet(t, s, key)
	writes := fencedWrites(t, s, key, c.Token)
	// A Complete repeated by the same owner is a retry whose first reply was
	// lost: it reports the completion it made, and changes nothing.
	if !writes["Complete"] {
		t.Error("Complete repeated by the owner that completed = false, want true (an idempotent retry)")
	}
	delete(writes, "Complete")
	noneSucceeded(t, writes, "by the owner after Complete")
	if complete1(t, s, idempotency.Completion{Key: key, Token: "00000000000000000000000000000000", Outcome: idempotency.RecordOutcomeOK, Retention: retention}) {
		t.Error("Complete by another token after completion = true")
	}
	unchanged(t, s, before, "writes after Complete")
}

func testFenceReleased(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if !release(t, s, key, c.Token, time.Minute) {
		t.Fatal("Release = false")
	}
	before := mustGet(t, s, key)
	noneSucceeded(t, fencedWrites(t, s, key, c.Token), "by the owner after Release")
	unchanged(t, s, before, "writes after Release")
}

func testFenceGone(t *testing.T, h *Harness) {
	s := h.Store
	never := newKey(t)
	noneSucceeded(t, fencedWrites(t, s, never, "00000000000000000000000000000000"), "on a key never claimed")
	if rec := get(t, s, never); rec != nil {
		t.Errorf("fenced writes on an absent key created %+v", rec)
	}
	key := newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if _, err := s.Delete(ctxT(t), key); err != nil {
		t.Fatal(err)
	}
	noneSucceeded(t, fencedWrites(t, s, key, c.Token), "by the owner after Delete")
	if rec := get(t, s, key); rec != nil {
		t.Errorf("fenced writes on a deleted key created %+v", rec)
	}
}

// A claim whose lease ran out but that nobody reclaimed is still its owner's:
// the token, not the clock, fences writes.
func testFenceExpiredStillOwned(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), shortLease), idempotency.ClaimNew)
	time.Sleep(expiry)
	if !saveStep(t, s, key, c.Token, "late", []byte("v")) {
		t.Error("SaveStep by the owner of an expired, unreclaimed claim = false")
	}
	mustComplete(t, s, c, "r")
}

func testDuplicateKeysRejected(t *testing.T, h *Harness) {
	s := h.Store
	a, b := newKey(t), newKey(t)
	_, err := s.Claim(ctxT(t), []idempotency.ClaimRequest{
		req(a, fp("a"), longLease), req(b, fp("b"), longLease), req(a, fp("a"), longLease),
	})
	if err == nil {
		t.Fatal("Claim of a batch with a key twice: no error")
	}
	if errors.Is(err, idempotency.ErrStoreUnavailable) {
		t.Errorf("a duplicate key is the caller's error, not the store's: %v", err)
	}
	if get(t, s, a) != nil || get(t, s, b) != nil {
		t.Error("a rejected batch claimed some of its keys")
	}
	c := mustOwn(t, s, req(a, fp("a"), longLease), idempotency.ClaimNew)
	_, err = s.Complete(ctxT(t), []idempotency.Completion{completion(c, "1"), completion(c, "2")})
	if err == nil {
		t.Fatal("Complete of a batch with a key twice: no error")
	}
	if rec := mustGet(t, s, a); rec.State != idempotency.StateClaimed {
		t.Errorf("a rejected completion batch completed %s", a)
	}
}

func testEmptyBatches(t *testing.T, h *Harness) {
	res, err := h.Store.Claim(ctxT(t), nil)
	if err != nil || len(res) != 0 {
		t.Errorf("Claim(nil) = %v, %v; want no results, no error", res, err)
	}
	ok, err := h.Store.Complete(ctxT(t), nil)
	if err != nil || len(ok) != 0 {
		t.Errorf("Complete(nil) = %v, %v; want no results, no error", ok, err)
	}
}

// A record that expired (its retention ran out) takes its fence with it; the
// next claim of the key must still get a larger one, or a
// downstream system that saw the old fence would take the new owner for a
// stale writer, and a stale writer holding the old fence for a current one.
func testFenceGrowsAcrossExpiry(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c1 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	done := completion(c1, "r")
	done.Retention = shortLease
	if !complete1(t, s, done) {
		t.Fatal("Complete with the owning token = false")
	}
	eventually(t, 10*time.Second, "the completed record to expire", func() bool { return get(t, s, key) == nil })
	c2 := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	if c2.Fence <= c1.Fence || c2.Attempts != 1 {
		t.Errorf("claim after expiry: fence %d attempts %d, want a fence above %d and a fresh 1", c2.Fence, c2.Attempts, c1.Fence)
	}
}

// eventually polls cond every 20ms until it holds, failing the test when
// it still does not after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
