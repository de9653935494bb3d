package redisbackend_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// A key's fence grows with every new owner whatever happened to its record
// in between: the record expired, was forgotten (Delete),
// was released, its lease ran out and it was reclaimed, or the whole Redis
// was wiped. Each step would hand out fence 1 again, or the same fence, if
// the fence were only the stored one + 1. The server is a private one: the
// test wipes it.
func TestFenceGrowsAcrossRecordLoss(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: time.Second})
	t.Cleanup(func() { _ = client.Close() })
	s := newStore(t, client, redisbackend.Options{Grace: time.Minute})
	ctx := ctxFor(t, 30*time.Second)
	const key = "orders:o-1"
	req := func(lease time.Duration) []idempotency.ClaimRequest {
		return []idempotency.ClaimRequest{{Key: key, Fingerprint: "1:f", FingerprintVersion: 1, Lease: lease}}
	}
	var last int64
	claim := func(step string, lease time.Duration, want idempotency.ClaimOutcome) *idempotency.Claim {
		t.Helper()
		floor := serverMicros(t, client)
		res, err := s.Claim(ctx, req(lease))
		if err != nil {
			t.Fatalf("%s: Claim: %v", step, err)
		}
		if res[0].Outcome != want {
			t.Fatalf("%s: Claim = %s, want %s", step, res[0].Outcome, want)
		}
		c := res[0].Claim
		if c.Fence <= last {
			t.Errorf("%s: fence %d, want above the key's last fence %d", step, c.Fence, last)
		}
		if c.Fence < floor {
			t.Errorf("%s: fence %d is below the server's clock %dµs at the claim", step, c.Fence, floor)
		}
		if rec, err := s.Get(ctx, key); err != nil || rec == nil || rec.Fence != c.Fence {
			t.Errorf("%s: stored record %+v (%v), want fence %d", step, rec, err, c.Fence)
		}
		last = c.Fence
		return c
	}
	complete := func(step string, c *idempotency.Claim, retention time.Duration) {
		t.Helper()
		ok, err := s.Complete(ctx, []idempotency.Completion{{Key: key, Token: c.Token, Outcome: idempotency.RecordOutcomeOK, Retention: retention}})
		if err != nil || !ok[0] {
			t.Fatalf("%s: Complete = %v, %v", step, ok, err)
		}
	}
	gone := func() bool {
		rec, err := s.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		return rec == nil
	}

	c := claim("first claim", time.Minute, idempotency.ClaimNew)
	complete("first claim", c, 200*time.Millisecond)
	testenv.Eventually(t, 10*time.Second, "the completed record to expire", gone)

	c = claim("after expiry", time.Minute, idempotency.ClaimNew)
	complete("after expiry", c, time.Hour)
	if existed, err := s.Delete(ctx, key); err != nil || !existed {
		t.Fatalf("Delete = %v, %v", existed, err)
	}

	c = claim("after Delete", time.Minute, idempotency.ClaimNew)
	if ok, err := s.Release(ctx, key, c.Token, time.Minute); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}

	claim("after Release", 100*time.Millisecond, idempotency.ClaimNew)
	var res []idempotency.ClaimResult
	testenv.Eventually(t, 10*time.Second, "the lease to run out", func() bool {
		var err error
		if res, err = s.Claim(ctx, req(time.Minute)); err != nil {
			t.Fatalf("Claim: %v", err)
		}
		return res[0].Outcome != idempotency.ClaimInFlight
	})
	if res[0].Outcome != idempotency.ClaimReclaimed || res[0].Claim.Fence <= last {
		t.Fatalf("after the lease ran out: %s fence %+v, want RECLAIMED above %d", res[0].Outcome, res[0].Claim, last)
	}
	last = res[0].Claim.Fence

	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	claim("after FLUSHALL", time.Minute, idempotency.ClaimNew)
}

// The fence, 16 digits in microseconds, survives every script that rewrites
// a record through cjson (which keeps 14 significant digits of a number):
// a step, a release, a completion with meta, a renewal of a record with
// steps, and a claim that carries steps over.
func TestFenceExactThroughEveryScript(t *testing.T) {
	t.Parallel()
	client := testenv.RedisClient(t)
	s := newStore(t, client, redisbackend.Options{})
	ctx := ctxFor(t, 10*time.Second)
	key := "orders:" + "exact-" + testenv.RandID()
	req := []idempotency.ClaimRequest{{Key: key, Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Minute}}
	stored := func(step string, want int64) {
		t.Helper()
		rec, err := s.Get(ctx, key)
		if err != nil || rec == nil {
			t.Fatalf("%s: Get = %+v, %v", step, rec, err)
		}
		if rec.Fence != want {
			t.Errorf("%s: stored fence %d, want %d", step, rec.Fence, want)
		}
	}
	res, err := s.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c1 := res[0].Claim
	if c1.Fence < 1e15 {
		t.Fatalf("fence %d: want the server's clock in µs (16 digits)", c1.Fence)
	}
	if ok, err := s.SaveStep(ctx, key, c1.Token, "charge", []byte("ch_1")); err != nil || !ok {
		t.Fatalf("SaveStep = %v, %v", ok, err)
	}
	stored("step", c1.Fence)
	if _, ok, err := s.Renew(ctx, key, c1.Token, time.Minute); err != nil || !ok {
		t.Fatalf("Renew = %v, %v", ok, err)
	}
	stored("renew of a record with steps", c1.Fence)
	if ok, err := s.Release(ctx, key, c1.Token, time.Minute); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	stored("release", c1.Fence)
	res, err = s.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c2 := res[0].Claim
	if c2.Fence <= c1.Fence || string(c2.Steps["charge"]) != "ch_1" {
		t.Fatalf("claim after release: fence %d steps %v, want above %d with the step", c2.Fence, c2.Steps, c1.Fence)
	}
	stored("claim with steps", c2.Fence)
	ok, err := s.Complete(ctx, []idempotency.Completion{{Key: key, Token: c2.Token, Outcome: idempotency.RecordOutcomeOK, Meta: map[string]string{"a": "b"}, Retention: time.Minute}})
	if err != nil || !ok[0] {
		t.Fatalf("Complete = %v, %v", ok, err)
	}
	stored("completion with meta", c2.Fence)
}
