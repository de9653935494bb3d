package redisbackend_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// awaitCacheReady waits until s's local cache has its invalidation
// subscription, and so answers.
func awaitCacheReady(t testing.TB, s *redisbackend.Store) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the local cache subscribes", func() bool { return s.LocalCacheStats().Subscribed })
}

// cacheFixture is a private redis-server (so that INFO commandstats and
// CLIENT KILL see only this test) and a client on it.
func cacheFixture(t *testing.T) (*redis.Client, context.Context) {
	t.Helper()
	srv := testenv.StartRedisServer(t)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opt)
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return client, ctx
}

func cachedStore(t *testing.T, client redis.UniversalClient, ns string, ttl time.Duration) *redisbackend.Store {
	t.Helper()
	s := newStore(t, client, redisbackend.Options{Namespace: ns, LocalCache: redisbackend.LocalCache{Entries: 100, TTL: ttl}})
	awaitCacheReady(t, s)
	return s
}

func req1(key, fp string) []idempotency.ClaimRequest {
	return []idempotency.ClaimRequest{{Key: key, Fingerprint: fp, FingerprintVersion: 1, Lease: 30 * time.Second, Retention: time.Hour}}
}

// runOnce claims key on s (NEW) and completes it with result.
func runOnce(t *testing.T, ctx context.Context, s *redisbackend.Store, key string, result []byte) *idempotency.Claim {
	t.Helper()
	res, err := s.Claim(ctx, req1(key, "1:a"))
	if err != nil || res[0].Outcome != idempotency.ClaimNew {
		t.Fatalf("claim %s: %v %+v", key, err, res)
	}
	ok, err := s.Complete(ctx, []idempotency.Completion{{Key: key, Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: result, Retention: time.Hour}})
	if err != nil || !ok[0] {
		t.Fatalf("complete %s: %v %v", key, err, ok)
	}
	return res[0].Claim
}

func claimOutcome(t *testing.T, ctx context.Context, s *redisbackend.Store, key, fp string) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(ctx, req1(key, fp))
	if err != nil {
		t.Fatalf("claim %s: %v", key, err)
	}
	return res[0]
}

// evalshaCalls is the server's count of EVALSHA and EVAL calls so far.
func evalshaCalls(t *testing.T, ctx context.Context, client *redis.Client) int64 {
	t.Helper()
	info, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
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

// A duplicate of a key this store completed is answered DUPLICATE, with the
// stored result, without a script call on the server; a key in the same
// batch that is not cached still goes to Redis, and the results keep the
// request order.
func TestLocalCacheAnswersDuplicateWithoutRedis(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	result := []byte(`{"status":"shipped"}`)
	cl := runOnce(t, ctx, s, "o:1", result)

	before := evalshaCalls(t, ctx, client)
	got := claimOutcome(t, ctx, s, "o:1", "1:a")
	after := evalshaCalls(t, ctx, client)
	if got.Outcome != idempotency.ClaimDuplicate || got.Record == nil || !bytes.Equal(got.Record.Result, result) ||
		got.Record.Token != cl.Token || got.Record.Fence != cl.Fence || got.Record.State != idempotency.StateCompleted {
		t.Fatalf("cached duplicate: %+v", got)
	}
	if after != before {
		t.Fatalf("the cached duplicate made %d script calls on the server, want 0", after-before)
	}
	stored, err := s.Get(ctx, "o:1")
	if err != nil || stored == nil || !stored.CompletedAt.Equal(got.Record.CompletedAt) || stored.Attempts != got.Record.Attempts {
		t.Fatalf("cached record %+v differs from the stored one %+v (%v)", got.Record, stored, err)
	}
	if h := s.LocalCacheStats().Hits; h != 1 {
		t.Fatalf("hits %d, want 1", h)
	}

	before = evalshaCalls(t, ctx, client)
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{
		{Key: "o:2", Fingerprint: "1:a", FingerprintVersion: 1, Lease: time.Minute},
		{Key: "o:1", Fingerprint: "1:a", FingerprintVersion: 1, Lease: time.Minute},
	})
	if err != nil || res[0].Outcome != idempotency.ClaimNew || res[1].Outcome != idempotency.ClaimDuplicate {
		t.Fatalf("mixed batch: %v %+v", err, res)
	}
	if n := evalshaCalls(t, ctx, client) - before; n != 1 {
		t.Fatalf("mixed batch made %d script calls, want 1 (for o:2 only)", n)
	}
}

// Another fingerprint of a cached key goes to Redis and is a MISMATCH.
func TestLocalCacheMismatchGoesToRedis(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	runOnce(t, ctx, s, "o:1", nil)
	expectMismatchFromRedis(t, ctx, client, s, "o:1", "1:b")
}

// expectMismatchFromRedis fails unless a claim of key with fingerprint fp
// is MISMATCH and reaches Redis: the cache answers only the fingerprint it
// holds.
func expectMismatchFromRedis(t *testing.T, ctx context.Context, client *redis.Client, s *redisbackend.Store, key, fp string) {
	t.Helper()
	before := evalshaCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, s, key, fp); got.Outcome != idempotency.ClaimMismatch {
		t.Fatalf("claim of %s with another fingerprint: %s, want MISMATCH", key, got.Outcome)
	}
	if evalshaCalls(t, ctx, client) == before {
		t.Fatal("the mismatch was answered without Redis")
	}
}

// The cache answers only for keys this store completed: not for a
// duplicate it was told of by Redis, nor for a completion that was refused
// (its claim was lost to another worker). Each key's record is then
// deleted behind the caches' back (no invalidation), and the next claim
// must reach Redis and find the key NEW.
func TestLocalCacheNeverAnswersForKeysItDidNotComplete(t *testing.T) {
	client, ctx := cacheFixture(t)
	a := cachedStore(t, client, "lc", time.Minute)
	b := cachedStore(t, client, "lc", time.Minute)

	runOnce(t, ctx, a, "seen", nil)
	if got := claimOutcome(t, ctx, b, "seen", "1:a"); got.Outcome != idempotency.ClaimDuplicate {
		t.Fatalf("b's claim: %s, want DUPLICATE from Redis", got.Outcome)
	}

	// b claims with a lease that runs out; a reclaims and completes; b's
	// late completion is refused.
	res, err := b.Claim(ctx, []idempotency.ClaimRequest{{Key: "lost", Fingerprint: "1:a", FingerprintVersion: 1, Lease: 50 * time.Millisecond}})
	if err != nil || res[0].Outcome != idempotency.ClaimNew {
		t.Fatalf("b claims lost: %v %+v", err, res)
	}
	stale := res[0].Claim
	var re idempotency.ClaimResult
	testenv.Eventually(t, 5*time.Second, "a reclaims the expired claim", func() bool {
		re = claimOutcome(t, ctx, a, "lost", "1:a")
		return re.Outcome == idempotency.ClaimReclaimed
	})
	if ok, err := a.Complete(ctx, []idempotency.Completion{{Key: "lost", Token: re.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Retention: time.Hour}}); err != nil || !ok[0] {
		t.Fatalf("a completes lost: %v %v", ok, err)
	}
	if ok, err := b.Complete(ctx, []idempotency.Completion{{Key: "lost", Token: stale.Token, Outcome: idempotency.RecordOutcomeOK, Retention: time.Hour}}); err != nil || ok[0] {
		t.Fatalf("b's stale completion: %v %v, want refused", ok, err)
	}

	for _, key := range []string{"seen", "lost"} {
		if err := client.Del(ctx, b.RedisKey(key)).Err(); err != nil {
			t.Fatal(err)
		}
		if got := claimOutcome(t, ctx, b, key, "1:a"); got.Outcome != idempotency.ClaimNew {
			t.Fatalf("%s: b answered %s after the record was deleted, want NEW from Redis", key, got.Outcome)
		}
	}
	if h := b.LocalCacheStats().Hits; h != 0 {
		t.Fatalf("b's cache answered %d claims", h)
	}
}

// A forget on one process (Delete, ForgetIf) reaches the cache of another
// at once: the key runs again there without waiting for the TTL.
func TestLocalCacheForgetInvalidatesOtherProcesses(t *testing.T) {
	client, ctx := cacheFixture(t)
	worker := cachedStore(t, client, "lc", time.Hour)
	admin := newStore(t, client, redisbackend.Options{Namespace: "lc"}) // as dedupworker forget, without a cache

	runOnce(t, ctx, worker, "o:1", nil)
	runOnce(t, ctx, worker, "o:2", nil)
	runOnce(t, ctx, worker, "o:3", nil)
	if got := claimOutcome(t, ctx, worker, "o:1", "1:a"); got.Outcome != idempotency.ClaimDuplicate {
		t.Fatalf("before forget: %s", got.Outcome)
	}
	if existed, err := admin.Delete(ctx, "o:1"); err != nil || !existed {
		t.Fatalf("Delete: %v %v", existed, err)
	}
	testenv.Eventually(t, 5*time.Second, "o:1 runs again after Delete", func() bool {
		return claimOutcome(t, ctx, worker, "o:1", "1:a").Outcome == idempotency.ClaimNew
	})
	// o:2 is still cached: the invalidation was for o:1 only.
	before := evalshaCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, worker, "o:2", "1:a"); got.Outcome != idempotency.ClaimDuplicate || evalshaCalls(t, ctx, client) != before {
		t.Fatalf("o:2 after forgetting o:1: %s, not from the cache", got.Outcome)
	}

	r, err := admin.ForgetIf(ctx, []string{"o:2"}, redisbackend.ClassCompleted, 0)
	if err != nil || r.Deleted != 1 {
		t.Fatalf("ForgetIf: %+v %v", r, err)
	}
	testenv.Eventually(t, 5*time.Second, "o:2 runs again after ForgetIf", func() bool {
		return claimOutcome(t, ctx, worker, "o:2", "1:a").Outcome == idempotency.ClaimNew
	})
	// A bulk forget empties the whole cache: o:3 goes to Redis, which
	// still has it.
	before = evalshaCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, worker, "o:3", "1:a"); got.Outcome != idempotency.ClaimDuplicate || evalshaCalls(t, ctx, client) == before {
		t.Fatalf("o:3 after the bulk forget: %s, want DUPLICATE from Redis", got.Outcome)
	}
}

// When an invalidation is lost (the record deleted behind the cache's
// back, as by hand or by eviction), the cache answers until its TTL, and
// not after: the key then runs again.
func TestLocalCacheLostInvalidationEndsAtTTL(t *testing.T) {
	client, ctx := cacheFixture(t)
	const ttl = 300 * time.Millisecond
	s := cachedStore(t, client, "lc", ttl)
	done := time.Now()
	runOnce(t, ctx, s, "o:1", nil)
	if err := client.Del(ctx, s.RedisKey("o:1")).Err(); err != nil {
		t.Fatal(err)
	}
	if got := claimOutcome(t, ctx, s, "o:1", "1:a"); got.Outcome != idempotency.ClaimDuplicate {
		if time.Since(done) < ttl {
			t.Fatalf("within the TTL: %s, want the cached DUPLICATE", got.Outcome)
		}
	}
	testenv.Eventually(t, 5*time.Second, "o:1 runs again once the TTL passed", func() bool {
		return claimOutcome(t, ctx, s, "o:1", "1:a").Outcome == idempotency.ClaimNew
	})
	if since := time.Since(done); since < ttl {
		t.Fatalf("the key ran again %s after its completion, before the TTL %s", since, ttl)
	}
}

// While the invalidation subscription is down the cache answers nothing.
// The Redis user loses its channels (so the subscriber cannot come back)
// and the subscriber's connection is killed; a record deleted behind the
// cache's back is then found gone at once, long before the TTL. Once the
// channels are granted again the cache resubscribes and answers again.
func TestLocalCacheUntrustedWithoutSubscription(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Hour)
	runOnce(t, ctx, s, "o:1", nil)
	if err := client.Del(ctx, s.RedisKey("o:1")).Err(); err != nil {
		t.Fatal(err)
	}
	if got := claimOutcome(t, ctx, s, "o:1", "1:a"); got.Outcome != idempotency.ClaimDuplicate {
		t.Fatalf("before the kill: %s, want the cached DUPLICATE", got.Outcome)
	}
	for _, cmd := range [][]any{{"ACL", "SETUSER", "default", "resetchannels"}, {"CLIENT", "KILL", "TYPE", "pubsub"}} {
		if err := client.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the cache sees its subscription lost", func() bool { return !s.LocalCacheStats().Subscribed })
	if got := claimOutcome(t, ctx, s, "o:1", "1:a"); got.Outcome != idempotency.ClaimNew {
		t.Fatalf("without a subscription: %s, want NEW from Redis", got.Outcome)
	}
	if n := s.LocalCacheStats().Entries; n != 0 {
		t.Fatalf("%d entries kept without a subscription", n)
	}
	if err := client.Do(ctx, "ACL", "SETUSER", "default", "allchannels").Err(); err != nil {
		t.Fatal(err)
	}
	awaitCacheReady(t, s)
	runOnce(t, ctx, s, "o:2", nil)
	before := evalshaCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, s, "o:2", "1:a"); got.Outcome != idempotency.ClaimDuplicate || evalshaCalls(t, ctx, client) != before {
		t.Fatalf("after resubscribing: %s, not from the cache", got.Outcome)
	}
}

// The cache holds at most Entries records, dropping the oldest, and an
// entry never outlives the completion's retention.
func TestLocalCacheBounds(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := newStore(t, client, redisbackend.Options{Namespace: "lc", LocalCache: redisbackend.LocalCache{Entries: 3, TTL: time.Hour}})
	awaitCacheReady(t, s)
	for i := range 5 {
		runOnce(t, ctx, s, fmt.Sprintf("o:%d", i), nil)
	}
	if n := s.LocalCacheStats().Entries; n != 3 {
		t.Fatalf("entries %d, want 3", n)
	}
	before := evalshaCalls(t, ctx, client)
	claimOutcome(t, ctx, s, "o:0", "1:a") // dropped: from Redis
	mid := evalshaCalls(t, ctx, client)
	claimOutcome(t, ctx, s, "o:4", "1:a") // newest: cached
	if mid == before || evalshaCalls(t, ctx, client) != mid {
		t.Fatalf("script calls %d (oldest), %d (newest): want 1 and 0", mid-before, evalshaCalls(t, ctx, client)-mid)
	}

	res, err := s.Claim(ctx, req1("short", "1:a"))
	if err != nil || res[0].Claim == nil {
		t.Fatalf("claim short: %v %+v", err, res)
	}
	const retention = 200 * time.Millisecond
	start := time.Now()
	if ok, err := s.Complete(ctx, []idempotency.Completion{{Key: "short", Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeOK, Retention: retention}}); err != nil || !ok[0] {
		t.Fatalf("complete short: %v %v", ok, err)
	}
	testenv.Eventually(t, 5*time.Second, "the record expires in Redis", func() bool {
		return claimOutcome(t, ctx, s, "short", "1:a").Outcome == idempotency.ClaimNew
	})
	if since := time.Since(start); since < retention-20*time.Millisecond {
		t.Fatalf("NEW after %s, before the retention %s", since, retention)
	}
}

// Options.LocalCache is validated, each error naming the field.
func TestLocalCacheOptions(t *testing.T) {
	client := testenv.RedisClient(t)
	for _, tc := range []struct {
		lc    redisbackend.LocalCache
		field string
		want  string
	}{
		{redisbackend.LocalCache{Entries: -1, TTL: time.Second}, "LocalCache.Entries", "-1: must not be negative"},
		{redisbackend.LocalCache{Entries: 10}, "LocalCache.TTL", "0s: must be at least 1ms"},
		{redisbackend.LocalCache{Entries: 10, TTL: -time.Second}, "LocalCache.TTL", "-1s: must not be negative"},
		{redisbackend.LocalCache{TTL: time.Second}, "LocalCache.Entries", "0 with LocalCache.TTL 1s"},
	} {
		_, err := redisbackend.New(client, redisbackend.Options{LocalCache: tc.lc})
		if optionField(err) != tc.field || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want a ConfigError for %s saying %q", tc.lc, err, tc.field, tc.want)
		}
	}
}

// A key whose run saved a step is not cached: its record holds the steps,
// which an OnDuplicate hook may read, so its duplicate goes to Redis.
func TestLocalCacheSkipsRecordsWithSteps(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	res, err := s.Claim(ctx, req1("o:1", "1:a"))
	if err != nil || res[0].Claim == nil {
		t.Fatalf("claim: %v %+v", err, res)
	}
	tok := res[0].Claim.Token
	if ok, err := s.SaveStep(ctx, "o:1", tok, "charge", []byte("ch_1")); err != nil || !ok {
		t.Fatalf("SaveStep: %v %v", ok, err)
	}
	if ok, err := s.Complete(ctx, []idempotency.Completion{{Key: "o:1", Token: tok, Outcome: idempotency.RecordOutcomeOK, Retention: time.Hour}}); err != nil || !ok[0] {
		t.Fatalf("complete: %v %v", ok, err)
	}
	before := evalshaCalls(t, ctx, client)
	got := claimOutcome(t, ctx, s, "o:1", "1:a")
	if got.Outcome != idempotency.ClaimDuplicate || string(got.Record.Steps["charge"]) != "ch_1" {
		t.Fatalf("duplicate of a record with steps: %+v", got)
	}
	if evalshaCalls(t, ctx, client) == before {
		t.Fatal("a record with steps was answered from the cache")
	}
}

// A dead-lettered completion is not cached: a redrive forgets the record and
// republishes the message at once, and the republished copy must reach
// Redis (and find the key gone) even before the forget's invalidation
// reaches this process.
func TestLocalCacheSkipsDeadLettered(t *testing.T) {
	client, ctx := cacheFixture(t)
	s := cachedStore(t, client, "lc", time.Minute)
	res, err := s.Claim(ctx, req1("o:1", "1:a"))
	if err != nil || res[0].Claim == nil {
		t.Fatalf("claim: %v %+v", err, res)
	}
	done := idempotency.Completion{Key: "o:1", Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeDeadLettered, Retention: time.Hour}
	if ok, err := s.Complete(ctx, []idempotency.Completion{done}); err != nil || !ok[0] {
		t.Fatalf("complete: %v %v", ok, err)
	}
	before := evalshaCalls(t, ctx, client)
	if got := claimOutcome(t, ctx, s, "o:1", "1:a"); got.Outcome != idempotency.ClaimDuplicate || got.Record.Outcome != idempotency.RecordOutcomeDeadLettered {
		t.Fatalf("claim of a dead-lettered key: %+v", got)
	}
	if evalshaCalls(t, ctx, client) == before {
		t.Fatal("a dead-lettered record was answered from the cache")
	}
	// Deleted behind the store's back (no invalidation): the next claim
	// owns the key, as a redriven message must.
	if err := client.Del(ctx, s.RedisKey("o:1")).Err(); err != nil {
		t.Fatal(err)
	}
	if got := claimOutcome(t, ctx, s, "o:1", "1:a"); got.Outcome != idempotency.ClaimNew {
		t.Fatalf("claim after the record was deleted: %s, want NEW", got.Outcome)
	}
}
