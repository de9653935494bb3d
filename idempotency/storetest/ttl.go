package storetest

import (
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

func ttlChecks() []check {
	needs := func(h *Harness) bool { return h.TTL != nil && h.Grace > 0 }
	return []check{
		{name: "TTL/Claimed", needs: needs, run: testTTLClaimed},
		{name: "TTL/ClaimedRetention", needs: needs, run: testTTLClaimedRetention},
		{name: "TTL/Completed", needs: needs, run: testTTLCompleted},
		{name: "TTL/Released", needs: needs, run: testTTLReleased},
	}
}

// ttlSlack is how much a TTL may have run down between the write and the
// read in a check.
const ttlSlack = 3 * time.Second

// ttlRounding is how much a TTL may exceed the one asked for: a renewal
// carries the key's tail beyond its lease over from PTTL and the server's
// clock, each rounded to the millisecond.
const ttlRounding = 5 * time.Millisecond

func wantTTL(t *testing.T, h *Harness, key string, want time.Duration, what string) {
	t.Helper()
	got := h.TTL(t, key)
	if got > want+ttlRounding || got < want-ttlSlack {
		t.Errorf("%s: TTL %s, want about %s (at most, and within %s)", what, got, want, ttlSlack)
	}
}

func testTTLClaimed(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), 10*time.Second), idempotency.ClaimNew)
	wantTTL(t, h, key, 10*time.Second+h.Grace, "CLAIMED")
	if _, ok := renew(t, s, key, c.Token, 40*time.Second); !ok {
		t.Fatal("Renew = false")
	}
	wantTTL(t, h, key, 40*time.Second+h.Grace, "renewed")
	before := h.TTL(t, key)
	if !saveStep(t, s, key, c.Token, "s", []byte("v")) {
		t.Fatal("SaveStep = false")
	}
	if after := h.TTL(t, key); after > before || after < before-ttlSlack {
		t.Errorf("SaveStep changed the TTL from %s to %s; it must keep it", before, after)
	}
	// A reclaim sets the TTL from the new lease.
	key2 := newKey(t)
	mustOwn(t, s, req(key2, fp("a"), shortLease), idempotency.ClaimNew)
	time.Sleep(expiry)
	mustOwn(t, s, req(key2, fp("a"), 20*time.Second), idempotency.ClaimReclaimed)
	wantTTL(t, h, key2, 20*time.Second+h.Grace, "reclaimed")
}

// A claim with a retention longer than the grace outlives its lease by the
// retention, and keeps that tail when renewed and when reclaimed, so a key
// whose worker dies on it is reclaimed with its attempts counted however
// late the next claim comes; a retention shorter than the
// grace changes nothing.
func testTTLClaimedRetention(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	keep := h.Grace + 5*time.Minute
	r := req(key, fp("a"), 10*time.Second)
	r.Retention = keep
	c := mustOwn(t, s, r, idempotency.ClaimNew)
	wantTTL(t, h, key, 10*time.Second+keep, "CLAIMED with a retention")
	if _, ok := renew(t, s, key, c.Token, 40*time.Second); !ok {
		t.Fatal("Renew = false")
	}
	wantTTL(t, h, key, 40*time.Second+keep, "renewed with a retention")

	key2 := newKey(t)
	r2 := req(key2, fp("a"), shortLease)
	r2.Retention = keep
	mustOwn(t, s, r2, idempotency.ClaimNew)
	time.Sleep(expiry)
	r2.Lease = 20 * time.Second
	if c := mustOwn(t, s, r2, idempotency.ClaimReclaimed); c.Attempts != 2 {
		t.Errorf("reclaimed with attempts %d, want 2", c.Attempts)
	}
	wantTTL(t, h, key2, 20*time.Second+keep, "reclaimed with a retention")

	key3 := newKey(t)
	r3 := req(key3, fp("a"), 10*time.Second)
	r3.Retention = h.Grace / 2
	mustOwn(t, s, r3, idempotency.ClaimNew)
	wantTTL(t, h, key3, 10*time.Second+h.Grace, "CLAIMED with a retention shorter than the grace")
}

func testTTLCompleted(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), 10*time.Second), idempotency.ClaimNew)
	comp := completion(c, "r")
	comp.Retention = 7 * time.Minute
	if !complete1(t, s, comp) {
		t.Fatal("Complete = false")
	}
	wantTTL(t, h, key, 7*time.Minute, "COMPLETED")
	mustNotOwn(t, s, req(key, fp("a"), 10*time.Second), idempotency.ClaimDuplicate)
	wantTTL(t, h, key, 7*time.Minute, "COMPLETED after a DUPLICATE claim")
}

func testTTLReleased(t *testing.T, h *Harness) {
	s := h.Store
	for _, tc := range []struct {
		keep, want time.Duration
	}{
		{keep: h.Grace + 2*time.Minute, want: h.Grace + 2*time.Minute},
		{keep: 0, want: h.Grace},                // at least grace
		{keep: time.Millisecond, want: h.Grace}, // at least grace
	} {
		key := newKey(t)
		c := mustOwn(t, s, req(key, fp("a"), 10*time.Second), idempotency.ClaimNew)
		if !release(t, s, key, c.Token, tc.keep) {
			t.Fatal("Release = false")
		}
		wantTTL(t, h, key, tc.want, "released with keep "+tc.keep.String())
	}
}
