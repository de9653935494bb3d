package redisbackend_test

import (
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// outlast lets d pass on the wall clock: the fault's duration (a worker
// that stays dead for longer than lease + grace), not a wait for an event.
func outlast(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	<-t.C
}

// A claim whose worker died, found after its lease and the store's grace
// have both passed, is RECLAIMED with its attempt counted, as long as the
// claim's retention has not passed: whether the worker died
// before its first renewal or after some. Without a retention the record
// is gone after lease + grace and the key starts again at attempt 1, the
// behaviour the engine's claims rule out: max_attempts must hold across
// worker deaths.
func TestExpiredClaimOutlivesGraceByRetention(t *testing.T) {
	t.Parallel()
	const (
		grace = 200 * time.Millisecond
		lease = 300 * time.Millisecond
		keep  = time.Minute
		// down is how long the dead worker stays down: past lease + grace
		// on the server's clock, with a margin.
		down = lease + grace + 700*time.Millisecond
	)
	s := newStore(t, testenv.RedisClient(t), redisbackend.Options{Grace: grace})
	claim := func(key string, retention time.Duration) *idempotency.Claim {
		t.Helper()
		res, err := s.Claim(t.Context(), []idempotency.ClaimRequest{{
			Key: key, Fingerprint: "1:aa", FingerprintVersion: 1, Lease: lease, Retention: retention,
		}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Claim == nil {
			t.Fatalf("claim of %s: %s, not owned", key, res[0].Outcome)
		}
		return res[0].Claim
	}
	outcome := func(key string, retention time.Duration) (idempotency.ClaimOutcome, int) {
		t.Helper()
		res, err := s.Claim(t.Context(), []idempotency.ClaimRequest{{
			Key: key, Fingerprint: "1:aa", FingerprintVersion: 1, Lease: lease, Retention: retention,
		}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Claim == nil {
			return res[0].Outcome, 0
		}
		return res[0].Outcome, res[0].Claim.Attempts
	}

	claim("crashed", keep)
	renewed := claim("renewed-then-crashed", keep)
	if _, ok, err := s.Renew(t.Context(), "renewed-then-crashed", renewed.Token, lease); err != nil || !ok {
		t.Fatalf("Renew = %v, %v", ok, err)
	}
	claim("no-retention", 0)
	outlast(down)

	for _, key := range []string{"crashed", "renewed-then-crashed"} {
		if o, n := outcome(key, keep); o != idempotency.ClaimReclaimed || n != 2 {
			t.Errorf("%s, claimed again after lease + grace: %s with attempts %d, want RECLAIMED with attempts 2", key, o, n)
		}
	}
	if o, n := outcome("no-retention", 0); o != idempotency.ClaimNew || n != 1 {
		t.Errorf("no-retention, claimed again after lease + grace: %s with attempts %d, want NEW with attempts 1 (the record is gone)", o, n)
	}

	// Once more: the count keeps growing, one per dead run.
	outlast(down)
	if o, n := outcome("crashed", keep); o != idempotency.ClaimReclaimed || n != 3 {
		t.Errorf("crashed, third claim: %s with attempts %d, want RECLAIMED with attempts 3", o, n)
	}
}
