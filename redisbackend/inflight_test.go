package redisbackend_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// serverCalls is the private server's count of commands run so far, every
// command but INFO (which reads the count) and PING (the subscribers'
// health checks, sent after seconds of silence on their own schedule).
// Commands a script runs count too.
func serverCalls(t *testing.T, ctx context.Context, client *redis.Client) int64 {
	t.Helper()
	info, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" || name == "cmdstat_ping" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats %q: %v", line, err)
		}
		n += v
	}
	return n
}

// claimNew claims key on s with lease and expects it NEW.
func claimNew(t *testing.T, ctx context.Context, s *redisbackend.Store, key string, lease time.Duration) *idempotency.Claim {
	t.Helper()
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: key, Fingerprint: "1:a", FingerprintVersion: 1, Lease: lease, Retention: time.Hour}})
	if err != nil || res[0].Outcome != idempotency.ClaimNew {
		t.Fatalf("claim %s: %v %+v", key, err, res)
	}
	return res[0].Claim
}

// complete1 completes one owned claim, outcome ok.
func complete1(t *testing.T, ctx context.Context, s *redisbackend.Store, cl *idempotency.Claim, result []byte) {
	t.Helper()
	ok, err := s.Complete(ctx, []idempotency.Completion{{Key: cl.Key, Token: cl.Token, Outcome: idempotency.RecordOutcomeOK, Result: result, Retention: time.Hour}})
	if err != nil || !ok[0] {
		t.Fatalf("complete %s: %v %v", cl.Key, err, ok)
	}
}

type waitResult struct {
	rec *idempotency.Record
	err error
	at  time.Time
}

// startWait runs s.Wait(key, max) in a goroutine the test owns; the result
// arrives on the channel.
func startWait(t *testing.T, s *redisbackend.Store, key string, max time.Duration) <-chan waitResult {
	t.Helper()
	out := make(chan waitResult, 1)
	testenv.Go(t, func(gctx context.Context) error {
		wctx, cancel := context.WithTimeout(gctx, max+5*time.Second)
		defer cancel()
		rec, err := s.Wait(wctx, key, max)
		out <- waitResult{rec, err, time.Now()}
		return nil
	})
	return out
}

func await(t *testing.T, ch <-chan waitResult, within time.Duration) waitResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("Wait did not return within %s", within)
		return waitResult{}
	}
}

// A claim of a key this store holds a live claim on is answered IN_FLIGHT
// without a command to Redis, with the record Redis holds; a key beside it
// in the batch still goes to Redis, and another fingerprint goes to Redis
// and is a MISMATCH.
func TestLocalInFlightAnswersWithoutRedis(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	cl := claimNew(t, ctx, s, "o:1", 30*time.Second)
	stored, err := s.Get(ctx, "o:1")
	if err != nil || stored == nil {
		t.Fatalf("Get: %v %v", stored, err)
	}

	before := serverCalls(t, ctx, client)
	got := claimOutcome(t, ctx, s, "o:1", "1:a")
	if n := serverCalls(t, ctx, client) - before; n != 0 {
		t.Fatalf("the claim of a held key sent %d commands to Redis, want 0", n)
	}
	r := got.Record
	if got.Outcome != idempotency.ClaimInFlight || got.Claim != nil || r == nil {
		t.Fatalf("claim of a held key: %+v, want IN_FLIGHT with a record", got)
	}
	if r.Key != stored.Key || r.State != idempotency.StateClaimed || r.Token != cl.Token || r.Fence != cl.Fence ||
		r.Attempts != stored.Attempts || !r.LeaseUntil.Equal(stored.LeaseUntil) || !r.ClaimedAt.Equal(stored.ClaimedAt) ||
		r.Fingerprint != stored.Fingerprint || r.FingerprintVersion != stored.FingerprintVersion {
		t.Fatalf("local IN_FLIGHT record %+v differs from the stored %+v", r, stored)
	}
	if st := s.LocalCacheStats(); st.InFlightHits != 1 || st.Held != 1 || st.Hits != 0 {
		t.Fatalf("stats %+v, want 1 in-flight hit, 1 held, 0 hits", st)
	}

	before = evalshaCalls(t, ctx, client)
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{
		{Key: "o:2", Fingerprint: "1:a", FingerprintVersion: 1, Lease: time.Minute},
		{Key: "o:1", Fingerprint: "1:a", FingerprintVersion: 1, Lease: time.Minute},
	})
	if err != nil || res[0].Outcome != idempotency.ClaimNew || res[1].Outcome != idempotency.ClaimInFlight {
		t.Fatalf("mixed batch: %v %+v", err, res)
	}
	if n := evalshaCalls(t, ctx, client) - before; n != 1 {
		t.Fatalf("mixed batch made %d script calls, want 1 (for o:2 only)", n)
	}

	expectMismatchFromRedis(t, ctx, client, s, "o:1", "1:b")
}

// A Wait on a key this store holds waits in process: once the store
// completes the key it returns the COMPLETED record, and neither the wait
// nor its wake-up sends a command to Redis. The claim after it is the
// cache's DUPLICATE.
func TestLocalInFlightWaitEndsAtCompletion(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	cl := claimNew(t, ctx, s, "o:1", 30*time.Second)

	before := serverCalls(t, ctx, client)
	done := startWait(t, s, "o:1", 20*time.Second)
	testenv.Eventually(t, 5*time.Second, "the Wait parks on the held claim", func() bool { return redisbackend.LocalWaiters(s, "o:1") })
	if n := serverCalls(t, ctx, client) - before; n != 0 {
		t.Fatalf("the parked Wait sent %d commands to Redis, want 0", n)
	}
	complete1(t, ctx, s, cl, []byte("shipped"))
	after := serverCalls(t, ctx, client)
	w := await(t, done, 5*time.Second)
	if n := serverCalls(t, ctx, client) - after; n != 0 {
		t.Fatalf("the Wait's end sent %d commands to Redis, want 0", n)
	}
	if w.err != nil || w.rec == nil || w.rec.State != idempotency.StateCompleted || string(w.rec.Result) != "shipped" || w.rec.Token != cl.Token {
		t.Fatalf("Wait: %+v %v, want the COMPLETED record", w.rec, w.err)
	}
	if st := s.LocalCacheStats(); st.LocalWaits != 1 || st.Held != 0 {
		t.Fatalf("stats %+v, want 1 local wait, nothing held", st)
	}
	before = serverCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, s, "o:1", "1:a"); got.Outcome != idempotency.ClaimDuplicate || serverCalls(t, ctx, client) != before {
		t.Fatalf("claim after the wait: %s, not the cache's DUPLICATE", got.Outcome)
	}

	// A Wait that runs out while the claim is live returns the CLAIMED
	// record, also without Redis.
	cl2 := claimNew(t, ctx, s, "o:2", 30*time.Second)
	before = serverCalls(t, ctx, client)
	rec, err := s.Wait(ctx, "o:2", 50*time.Millisecond)
	if n := serverCalls(t, ctx, client) - before; n != 0 || err != nil || rec == nil || rec.State != idempotency.StateClaimed || rec.Token != cl2.Token {
		t.Fatalf("Wait past max: %+v %v, %d commands; want the CLAIMED record and none", rec, err, n)
	}
}

// A Release of the held claim ends a local Wait at once: it goes on with
// Redis, which has the key released, and returns nil; the next claim goes
// to Redis and owns the key.
func TestLocalInFlightWaitEndsAtRelease(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	cl := claimNew(t, ctx, s, "o:1", 30*time.Second)
	done := startWait(t, s, "o:1", 20*time.Second)
	testenv.Eventually(t, 5*time.Second, "the Wait parks on the held claim", func() bool { return redisbackend.LocalWaiters(s, "o:1") })
	released := time.Now()
	if ok, err := s.Release(ctx, "o:1", cl.Token, 0); err != nil || !ok {
		t.Fatalf("Release: %v %v", ok, err)
	}
	w := await(t, done, 10*time.Second)
	if w.err != nil || w.rec != nil {
		t.Fatalf("Wait after Release: %+v %v, want nil (claim again)", w.rec, w.err)
	}
	// The Redis path's first read comes after its subscription, normally
	// in a round trip or two; PollFloor (50ms) re-reads bound it anyway.
	if took := w.at.Sub(released); took > 2*time.Second {
		t.Fatalf("Wait returned %s after the Release, want promptly", took)
	}
	before := evalshaCalls(t, ctx, client)
	res, err := s.Claim(ctx, req1("o:1", "1:a"))
	if err != nil || res[0].Outcome != idempotency.ClaimNew || res[0].Claim.Token == cl.Token || evalshaCalls(t, ctx, client) == before {
		t.Fatalf("claim after Release: %v %+v, want NEW from Redis", err, res)
	}
}

// The local answers of a claim stop before its lease ends (by the margin),
// and a renewal moves them; a renewal that finds the claim lost ends them.
func TestLocalInFlightEndsWithTheLease(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	const lease = 400 * time.Millisecond
	start := time.Now()
	claimNew(t, ctx, s, "o:1", lease)
	before := serverCalls(t, ctx, client)
	got := claimOutcome(t, ctx, s, "o:1", "1:a")
	if time.Since(start) < lease/2 && (got.Outcome != idempotency.ClaimInFlight || serverCalls(t, ctx, client) != before) {
		t.Fatalf("within the lease: %s, not the local IN_FLIGHT", got.Outcome)
	}
	// A Wait longer than the lease waits locally until the lease's local
	// end, then asks Redis, which has the claim expired but still CLAIMED.
	before = serverCalls(t, ctx, client)
	rec, err := s.Wait(ctx, "o:1", lease+300*time.Millisecond)
	if err != nil || rec == nil || rec.State != idempotency.StateClaimed || serverCalls(t, ctx, client) == before {
		t.Fatalf("Wait past the lease: %+v %v; want the CLAIMED record, read from Redis", rec, err)
	}
	var re idempotency.ClaimResult
	testenv.Eventually(t, 5*time.Second, "the expired claim is reclaimed from Redis", func() bool {
		re = claimOutcome(t, ctx, s, "o:1", "1:a")
		return re.Outcome == idempotency.ClaimReclaimed
	})
	if since := time.Since(start); since < lease-lease/10 {
		t.Fatalf("reclaimed %s after the claim, before its lease %s less the margin", since, lease)
	}

	// Renewed before its end, the claim answers locally past its first
	// lease.
	claimedAt := time.Now()
	cl := claimNew(t, ctx, s, "o:2", lease)
	if _, ok, err := s.Renew(ctx, "o:2", cl.Token, 30*time.Second); err != nil || !ok {
		t.Fatalf("Renew: %v %v", ok, err)
	}
	select { // the test is about the first lease passing: wait it out
	case <-time.After(time.Until(claimedAt.Add(lease + lease/2))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	before = serverCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, s, "o:2", "1:a"); got.Outcome != idempotency.ClaimInFlight || serverCalls(t, ctx, client) != before {
		t.Fatalf("after the renewal, past the first lease: %s, not the local IN_FLIGHT", got.Outcome)
	}

	// The record is deleted behind the store's back: the renewal finds the
	// claim gone, and the key goes to Redis at once.
	if err := client.Del(ctx, s.RedisKey("o:2")).Err(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Renew(ctx, "o:2", cl.Token, 30*time.Second); err != nil || ok {
		t.Fatalf("Renew of a deleted claim: %v %v, want false", ok, err)
	}
	if got := claimOutcome(t, ctx, s, "o:2", "1:a"); got.Outcome != idempotency.ClaimNew {
		t.Fatalf("after the failed renewal: %s, want NEW from Redis", got.Outcome)
	}
}

// A claim of a key this Store already held a claim on (its lease ran out,
// and the key was reclaimed) replaces the old claim in the cache: the old
// token's failed renewal and completion leave the new claim answering
// locally, and it is the new claim's completion that is cached.
func TestLocalCacheReclaimReplacesTheOldClaim(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	old := claimNew(t, ctx, s, "o:1", 200*time.Millisecond)
	var re idempotency.ClaimResult
	testenv.Eventually(t, 5*time.Second, "the expired claim is reclaimed from Redis", func() bool {
		re = claimOutcome(t, ctx, s, "o:1", "1:a")
		return re.Outcome == idempotency.ClaimReclaimed
	})
	if _, ok, err := s.Renew(ctx, "o:1", old.Token, 30*time.Second); err != nil || ok {
		t.Fatalf("Renew under the old token: %v %v, want false", ok, err)
	}
	ok, err := s.Complete(ctx, []idempotency.Completion{{Key: "o:1", Token: old.Token, Outcome: idempotency.RecordOutcomeOK, Retention: time.Hour}})
	if err != nil || ok[0] {
		t.Fatalf("Complete under the old token: %v %v, want false", ok, err)
	}
	before := serverCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, s, "o:1", "1:a"); got.Outcome != idempotency.ClaimInFlight ||
		got.Record.Token != re.Claim.Token || serverCalls(t, ctx, client) != before {
		t.Fatalf("after the old token's renewal and completion: %s of token %s; want the new claim's local IN_FLIGHT",
			got.Outcome, got.Record.Token)
	}
	complete1(t, ctx, s, re.Claim, []byte("new"))
	before = serverCalls(t, ctx, client)
	got := claimOutcome(t, ctx, s, "o:1", "1:a")
	if got.Outcome != idempotency.ClaimDuplicate || got.Record.Token != re.Claim.Token ||
		string(got.Record.Result) != "new" || serverCalls(t, ctx, client) != before {
		t.Fatalf("after the new claim's completion: %s %+v; want its record from the cache", got.Outcome, got.Record)
	}
}

// Without a confirmed invalidation subscription nothing is answered
// locally: a held claim, a Wait, and a claim made while the subscription
// was down all go to Redis, also after it is back (a claim held from
// before may have missed an invalidation).
func TestLocalInFlightUntrustedWithoutSubscription(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	claimNew(t, ctx, s, "o:1", 30*time.Second)
	for _, cmd := range [][]any{{"ACL", "SETUSER", "default", "resetchannels"}, {"CLIENT", "KILL", "TYPE", "pubsub"}} {
		if err := client.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the cache sees its subscription lost", func() bool { return !s.LocalCacheStats().Subscribed })
	before := evalshaCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, s, "o:1", "1:a"); got.Outcome != idempotency.ClaimInFlight || evalshaCalls(t, ctx, client) == before {
		t.Fatalf("untrusted: %s, want IN_FLIGHT from Redis", got.Outcome)
	}
	before = serverCalls(t, ctx, client)
	if rec, err := s.Wait(ctx, "o:1", 0); err != nil || rec == nil || serverCalls(t, ctx, client) == before {
		t.Fatalf("untrusted Wait: %+v %v, want the record read from Redis", rec, err)
	}
	claimNew(t, ctx, s, "o:2", 30*time.Second)
	if st := s.LocalCacheStats(); st.Held != 0 || st.InFlightHits != 0 {
		t.Fatalf("stats without a subscription %+v: nothing may be held or answered", st)
	}

	if err := client.Do(ctx, "ACL", "SETUSER", "default", "allchannels").Err(); err != nil {
		t.Fatal(err)
	}
	awaitCacheReady(t, s)
	for _, key := range []string{"o:1", "o:2"} {
		before := evalshaCalls(t, ctx, client)
		if got := claimOutcome(t, ctx, s, key, "1:a"); got.Outcome != idempotency.ClaimInFlight || evalshaCalls(t, ctx, client) == before {
			t.Fatalf("%s after resubscribing: %s, want IN_FLIGHT from Redis", key, got.Outcome)
		}
	}
	if h := s.LocalCacheStats().InFlightHits; h != 0 {
		t.Fatalf("%d claims answered locally", h)
	}
}

// A forget of a held key (Delete on another process) ends its local
// answers: a parked Wait wakes and finds the key gone in Redis, and the
// next claim owns it. A bulk forget (ForgetIf) ends them all.
func TestLocalInFlightEndsAtInvalidation(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	admin := newStore(t, client, redisbackend.Options{Namespace: "lc"})
	claimNew(t, ctx, s, "o:1", 30*time.Second)
	claimNew(t, ctx, s, "o:2", 30*time.Second)
	done := startWait(t, s, "o:1", 20*time.Second)
	testenv.Eventually(t, 5*time.Second, "the Wait parks on the held claim", func() bool { return redisbackend.LocalWaiters(s, "o:1") })
	if existed, err := admin.Delete(ctx, "o:1"); err != nil || !existed {
		t.Fatalf("Delete: %v %v", existed, err)
	}
	if w := await(t, done, 10*time.Second); w.err != nil || w.rec != nil {
		t.Fatalf("Wait on a forgotten key: %+v %v, want nil", w.rec, w.err)
	}
	if got := claimOutcome(t, ctx, s, "o:1", "1:a"); got.Outcome != idempotency.ClaimNew {
		t.Fatalf("claim of the forgotten key: %s, want NEW", got.Outcome)
	}
	// o:2 was not forgotten: still local.
	before := serverCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, s, "o:2", "1:a"); got.Outcome != idempotency.ClaimInFlight || serverCalls(t, ctx, client) != before {
		t.Fatalf("o:2 after forgetting o:1: %s, not the local IN_FLIGHT", got.Outcome)
	}
	if _, err := admin.ForgetIf(ctx, []string{"o:2"}, redisbackend.ClassClaimed, 0); err != nil {
		t.Fatalf("ForgetIf: %v", err)
	}
	testenv.Eventually(t, 5*time.Second, "the bulk forget ends every local answer", func() bool { return s.LocalCacheStats().Held == 0 })
	if got := claimOutcome(t, ctx, s, "o:2", "1:a"); got.Outcome != idempotency.ClaimNew {
		t.Fatalf("claim of o:2 after the bulk forget: %s, want NEW", got.Outcome)
	}
}

// A key another store (another process) holds is never answered locally:
// its claim and its Wait go to Redis, and the Wait ends with the other
// store's completion, heard through Redis.
func TestLocalInFlightNotForOtherStores(t *testing.T) {
	client, ctx := cacheFixture(t)
	a := cachedStore(t, client, "lc", time.Minute)
	b := cachedStore(t, client, "lc", time.Minute)
	cl := claimNew(t, ctx, a, "o:1", 30*time.Second)
	before := evalshaCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, b, "o:1", "1:a"); got.Outcome != idempotency.ClaimInFlight || evalshaCalls(t, ctx, client) == before {
		t.Fatalf("b's claim of a's key: %s, want IN_FLIGHT from Redis", got.Outcome)
	}
	before = serverCalls(t, ctx, client)
	done := startWait(t, b, "o:1", 20*time.Second)
	testenv.Eventually(t, 5*time.Second, "b's Wait reads Redis", func() bool { return serverCalls(t, ctx, client) > before })
	complete1(t, ctx, a, cl, []byte("r"))
	if w := await(t, done, 10*time.Second); w.err != nil || w.rec == nil || w.rec.State != idempotency.StateCompleted {
		t.Fatalf("b's Wait: %+v %v, want the COMPLETED record", w.rec, w.err)
	}
	if st := b.LocalCacheStats(); st.InFlightHits != 0 || st.LocalWaits != 0 || st.Held != 0 {
		t.Fatalf("b's stats %+v: nothing of a's key may be answered locally", st)
	}
}

// The claims that answer locally are bounded by LocalCache.Entries: past
// it a claim of a held key goes to Redis.
func TestLocalInFlightBounded(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := newStore(t, client, redisbackend.Options{Namespace: "lc", LocalCache: redisbackend.LocalCache{Entries: 3, TTL: time.Hour}})
	awaitCacheReady(t, s)
	keys := []string{"o:0", "o:1", "o:2", "o:3", "o:4"}
	for _, k := range keys {
		claimNew(t, ctx, s, k, 30*time.Second)
	}
	if n := s.LocalCacheStats().Held; n != 3 {
		t.Fatalf("held %d, want 3", n)
	}
	for i, k := range keys {
		before := evalshaCalls(t, ctx, client)
		got := claimOutcome(t, ctx, s, k, "1:a")
		local := evalshaCalls(t, ctx, client) == before
		if got.Outcome != idempotency.ClaimInFlight || local != (i < 3) {
			t.Fatalf("%s: %s, local %v; want IN_FLIGHT, local for the first 3 only", k, got.Outcome, local)
		}
	}
}

// Through the engine: a duplicate that arrives while its original runs in
// this process is answered IN_FLIGHT locally at its batch claim and at its
// own claim, waits in process, and is acked as a duplicate once the
// original completes, without sending Redis a command until then. The
// handler runs once.
func TestLocalInFlightThroughTheEngine(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	eng, err := idempotency.New(s, idempotency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	dedup, err := eng.Processor(idempotency.WithInFlightWait(20 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	p := dedup("relay", consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
		return []byte("ok"), nil
	}))
	process := func(d *consumertest.Delivery) <-chan struct{} {
		done := make(chan struct{})
		testenv.Go(t, func(gctx context.Context) error {
			defer close(done)
			p.Prepare(gctx, []consumer.Delivery{d})
			p.Process(gctx, d)
			return nil
		})
		return done
	}
	orig := consumertest.NewDelivery(consumertest.NewMessage("o:1", `{"n":1}`), 1)
	dup := consumertest.NewDelivery(consumertest.NewMessage("o:1", `{"n":1}`), 1)
	origDone := process(orig)
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before the goroutines' cleanups: a failed test must not hold the handler
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the original's handler did not start")
	}

	before := serverCalls(t, ctx, client)
	dupDone := process(dup)
	ekey := idempotency.EffectiveKey("relay", "o:1")
	testenv.Eventually(t, 10*time.Second, "the duplicate waits in process", func() bool { return redisbackend.LocalWaiters(s, ekey) })
	if n := serverCalls(t, ctx, client) - before; n != 0 {
		t.Fatalf("the duplicate sent %d commands to Redis while its original ran, want 0", n)
	}
	letGo()
	for _, done := range []<-chan struct{}{origDone, dupDone} {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("a delivery was not settled")
		}
	}
	orig.ExpectAcked(t)
	dup.ExpectAcked(t)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if st := s.LocalCacheStats(); st.InFlightHits < 2 || st.LocalWaits != 1 || st.Hits != 1 {
		t.Fatalf("stats %+v: want the batch claim and the claim IN_FLIGHT locally, one local wait, the final claim a cache hit", st)
	}
}
