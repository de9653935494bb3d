package redisbackend_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

var benchSeq atomic.Int64

// benchFP is a fingerprint of the size the engine sends.
const benchFP = "1:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"

// newBenchKeys fills reqs with claims of new keys.
func newBenchKeys(reqs []idempotency.ClaimRequest, retention time.Duration) {
	for i := range reqs {
		reqs[i] = idempotency.ClaimRequest{
			Key: fmt.Sprintf("bench:%d", benchSeq.Add(1)), Fingerprint: benchFP, FingerprintVersion: 1,
			Lease: 30 * time.Second, Retention: retention,
		}
	}
}

// claimBench claims reqs, which must all be new, and fills cs with their
// completions.
func claimBench(b *testing.B, ctx context.Context, s *redisbackend.Store, reqs []idempotency.ClaimRequest, cs []idempotency.Completion, result []byte, keep time.Duration) {
	res, err := s.Claim(ctx, reqs)
	if err != nil {
		b.Fatal(err)
	}
	for i, r := range res {
		if r.Outcome != idempotency.ClaimNew {
			b.Fatalf("outcome %s", r.Outcome)
		}
		cs[i] = idempotency.Completion{
			Key: r.Claim.Key, Token: r.Claim.Token, Outcome: idempotency.RecordOutcomeOK,
			Result: result, Retention: keep,
		}
	}
}

// completeBench completes cs, which must all be owned.
func completeBench(b *testing.B, ctx context.Context, s *redisbackend.Store, cs []idempotency.Completion) {
	ok, err := s.Complete(ctx, cs)
	if err != nil {
		b.Fatal(err)
	}
	for _, v := range ok {
		if !v {
			b.Fatal("completion not owned")
		}
	}
}

// BenchmarkClaimComplete measures the store's work for one message that
// runs once: claim, then complete. per-message sends one claim and one
// completion per message; batch-64 claims 64 messages in one call and
// completes them in one call, as the engine does with a fetched batch.
// ns/msg is the time per message; calls/msg the Redis commands and
// trips/msg the round trips per message.
func BenchmarkClaimComplete(b *testing.B) {
	opt, err := redis.ParseURL(testenv.Redis(b))
	if err != nil {
		b.Fatal(err)
	}
	client := redis.NewClient(opt)
	b.Cleanup(func() { _ = client.Close() })
	hook := &countHook{}
	client.AddHook(hook)

	for _, size := range []int{1, 64} {
		name := "per-message"
		if size > 1 {
			name = fmt.Sprintf("batch-%d", size)
		}
		b.Run(name, func(b *testing.B) {
			s := newStore(b, client, redisbackend.Options{})
			ctx := context.Background()
			reqs := make([]idempotency.ClaimRequest, size)
			cs := make([]idempotency.Completion, size)
			run := func() {
				newBenchKeys(reqs, 24*time.Hour)
				claimBench(b, ctx, s, reqs, cs, []byte(`{"status":"shipped"}`), 30*time.Second)
				completeBench(b, ctx, s, cs)
			}
			run() // load the scripts
			hook.cmds.Store(0)
			hook.trips.Store(0)
			msgs := 0
			for b.Loop() {
				run()
				msgs += size
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(msgs), "ns/msg")
			b.ReportMetric(float64(hook.cmds.Load())/float64(msgs), "calls/msg")
			b.ReportMetric(float64(hook.trips.Load())/float64(msgs), "trips/msg")
		})
	}
}

// BenchmarkStoreClientSide measures the client side of Store.Claim and
// Store.Complete on a real Redis: one call of a batch of 1, 10 or 100 new
// keys (claim) or of their completions (complete), plain and with a
// LocalCache. allocs/key and B/key are the heap allocations of the timed
// call divided by its keys; they count the Store's and go-redis's work,
// not the server's, and so do not move with the machine's load. The keys
// and claims are made outside the timed call.
func BenchmarkStoreClientSide(b *testing.B) {
	client := testenv.RedisClient(b)
	result := []byte(`{"status":"shipped"}`)
	for _, cached := range []bool{false, true} {
		for _, op := range []string{"claim", "complete"} {
			for _, size := range []int{1, 10, 100} {
				name := fmt.Sprintf("%s/keys-%d", op, size)
				opts := redisbackend.Options{}
				if cached {
					name = "cache/" + name
					opts.LocalCache = redisbackend.LocalCache{Entries: 1 << 16, TTL: time.Minute}
				}
				b.Run(name, func(b *testing.B) {
					s := newStore(b, client, opts)
					if cached {
						waitSubscribed(b, s)
					}
					ctx := context.Background()
					reqs := make([]idempotency.ClaimRequest, size)
					cs := make([]idempotency.Completion, size)
					prepare := func() { newBenchKeys(reqs, time.Minute) }
					claim := func() { claimBench(b, ctx, s, reqs, cs, result, time.Minute) }
					complete := func() { completeBench(b, ctx, s, cs) }
					prepare()
					claim()
					complete() // the scripts are loaded
					var before, after runtime.MemStats
					var mallocs, bytes uint64
					keys := 0
					for b.Loop() {
						b.StopTimer()
						prepare()
						if op == "complete" {
							claim()
						}
						runtime.ReadMemStats(&before)
						b.StartTimer()
						if op == "claim" {
							claim()
						} else {
							complete()
						}
						b.StopTimer()
						runtime.ReadMemStats(&after)
						mallocs += after.Mallocs - before.Mallocs
						bytes += after.TotalAlloc - before.TotalAlloc
						keys += size
						if op == "claim" {
							complete() // keeps the cache's pending claims bounded
						}
						b.StartTimer()
					}
					b.ReportMetric(float64(mallocs)/float64(keys), "allocs/key")
					b.ReportMetric(float64(bytes)/float64(keys), "B/key")
				})
			}
		}
	}
}

// waitSubscribed waits, up to 10s, for s's local cache to trust its
// invalidation subscription: before that it answers nothing.
func waitSubscribed(b *testing.B, s *redisbackend.Store) {
	b.Helper()
	testenv.Eventually(b, 10*time.Second, "the local cache's invalidation subscription is confirmed", func() bool {
		return s.LocalCacheStats().Subscribed
	})
}
