package redisbackend

import (
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

// BenchmarkLocalCache measures the local cache's own work for a key of a
// backlog with no duplicates, as the relay makes it: a claim that misses
// the cache, the owned claim remembered, its completion cached (a full
// cache drops its oldest entry). Batches of 100 keys, a cache of 10 000
// entries (the binary's default), no Redis.
//
//	go test ./redisbackend -run '^$' -bench LocalCache -benchmem
func BenchmarkLocalCache(b *testing.B) {
	const batch, entries = 100, 10000
	c := newLocalCache(LocalCache{Entries: entries, TTL: 10 * time.Second})
	c.setTrusted(true)
	keys := make([]string, 4*entries)
	for i := range keys {
		keys[i] = "bench:dedup:relay:k-" + strconv.Itoa(i)
	}
	start := time.Now()
	cs := make([]idempotency.Completion, batch)
	done := make([]completedKey, batch)
	result := []byte("ok")
	n := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now := time.Now()
		epoch := c.snapshot()
		p := make([]cacheSlot, batch)
		for j := range p {
			rkey := keys[n%len(keys)]
			n++
			if _, ok := c.answer([]byte(rkey), "fp", 1, now); ok {
				b.Fatal("a fresh key was answered")
			}
			token := strconv.Itoa(n)
			p[j] = cacheSlot{key: rkey, rkey: rkey, token: token, fp: "fp", fpv: 1, fence: 1, attempts: 1,
				claimedAt: now, leaseUntil: now.Add(30 * time.Second), answerUntil: now.Add(27 * time.Second)}
			done[j] = completedKey{rkey: rkey, written: true, at: start}
			cs[j] = idempotency.Completion{Key: rkey, Token: token, Outcome: idempotency.RecordOutcomeOK, Result: result, Retention: time.Hour}
		}
		c.claimed(p, epoch, time.Minute)
		c.completed(c.snapshot(), now, cs, done)
	}
	b.StopTimer()
	if got := c.stats().Entries; got != min(n, entries) {
		b.Fatalf("the cache holds %d entries, want %d", got, min(n, entries))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/key")
}
