package redisbackend_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

var benchSeq atomic.Int64

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
				for i := range reqs {
					reqs[i] = idempotency.ClaimRequest{
						Key:         fmt.Sprintf("bench:%d", benchSeq.Add(1)),
						Fingerprint: "1:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8", FingerprintVersion: 1,
						Lease: 30 * time.Second, Retention: 24 * time.Hour,
					}
				}
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
						Result: []byte(`{"status":"shipped"}`), Retention: 30 * time.Second,
					}
				}
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
