package redisbackend_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// BenchmarkRedisCPU measures what the store costs the Redis server per
// message: the INFO used_cpu_user + used_cpu_sys delta over the loop,
// divided by the messages (redis-us/msg). Each iteration is one batch of
// messages: claimed in one call, and (but for claim-only) the NEW ones
// completed in one call. The dup=30 runs make 30 of every 100 messages a key that
// this store completed before (the duplicates of a broker's redelivery to
// the process that completed them); local-cache runs with
// Options.LocalCache on.
//
// It runs against a private redis-server, so that other clients' work is
// not counted, or against DEDUP_COST_REDIS_URL. With DEDUP_CALLGRIND_PID
// (the pid of a redis-server running under valgrind --tool=callgrind) it
// zeroes the counters before each loop and dumps them after, with the
// sub-benchmark's name as the dump's hint, so the dump's instruction count
// is exactly the loop's (docs/PERFORMANCE.md has the commands).
func BenchmarkRedisCPU(b *testing.B) {
	client, pid := costServer(b)

	type variant struct {
		name      string
		size      int
		dupPct    int
		claimOnly bool
		cache     bool
	}
	var vs []variant
	for _, size := range []int{1, 10, 100} {
		vs = append(vs,
			variant{name: fmt.Sprintf("claim-only/batch=%d", size), size: size, claimOnly: true},
			variant{name: fmt.Sprintf("claim+complete/batch=%d", size), size: size},
			variant{name: fmt.Sprintf("claim+complete/batch=%d/dup=30%%", size), size: size, dupPct: 30},
			variant{name: fmt.Sprintf("claim+complete/batch=%d/dup=30%%/local-cache", size), size: size, dupPct: 30, cache: true},
		)
	}
	for _, v := range vs {
		b.Run(v.name, func(b *testing.B) {
			opts := redisbackend.Options{}
			if v.cache {
				opts.LocalCache = redisbackend.LocalCache{Entries: 100_000, TTL: time.Minute}
			}
			s := newStore(b, client, opts)
			ctx := context.Background()
			if v.cache {
				awaitCacheReady(b, s)
			}
			var done []string // keys completed, re-sent as duplicates
			seq, msg := 0, 0
			reqs := make([]idempotency.ClaimRequest, v.size)
			cs := make([]idempotency.Completion, 0, v.size)
			batch := func() int {
				for i := range reqs {
					var key string
					msg++
					if (msg*37)%100 < v.dupPct && len(done) > 0 { // spread: 30 of every 100, not in runs
						key = done[(msg*7919)%len(done)]
					} else {
						seq++
						key = "cost:" + strconv.Itoa(seq)
					}
					reqs[i] = idempotency.ClaimRequest{
						Key:         key,
						Fingerprint: "1:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8", FingerprintVersion: 1,
						Lease: 30 * time.Second, Retention: time.Hour,
					}
				}
				res, err := s.Claim(ctx, dedupKeys(reqs))
				if err != nil {
					b.Fatal(err)
				}
				if v.claimOnly {
					return len(res)
				}
				cs = cs[:0]
				for _, r := range res {
					if r.Claim != nil {
						cs = append(cs, idempotency.Completion{
							Key: r.Claim.Key, Token: r.Claim.Token, Outcome: idempotency.RecordOutcomeOK,
							Result: []byte(`{"status":"shipped"}`), Retention: time.Hour,
						})
					}
				}
				if len(cs) > 0 {
					if _, err := s.Complete(ctx, cs); err != nil {
						b.Fatal(err)
					}
					for _, c := range cs {
						if len(done) < 10_000 {
							done = append(done, c.Key)
						}
					}
				}
				return len(res)
			}
			for range 3 { // load the scripts, and have keys to repeat
				batch()
			}
			msgs := 0
			callgrind(b, pid, "-z")
			before := redisCPU(b, client)
			for b.Loop() {
				msgs += batch()
			}
			after := redisCPU(b, client)
			callgrind(b, pid, "--dump="+strings.NewReplacer("/", "_", "%", "pct", "+", "_").Replace(v.name))
			b.ReportMetric((after-before).Seconds()*1e6/float64(msgs), "redis-us/msg")
			b.ReportMetric(float64(s.LocalCacheStats().Hits)/float64(msgs), "cache-hits/msg")
		})
	}
}

// costServer returns a client of the server the cost benchmarks measure
// (DEDUP_COST_REDIS_URL, else a private redis-server) and the pid of the
// callgrind that runs it (DEDUP_CALLGRIND_PID; "" for none).
func costServer(b *testing.B) (*redis.Client, string) {
	url := os.Getenv("DEDUP_COST_REDIS_URL")
	if url == "" {
		url = testenv.StartRedisServer(b).URL()
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	opt.ReadTimeout = time.Minute // a server under valgrind is slow
	client := redis.NewClient(opt)
	b.Cleanup(func() { _ = client.Close() })
	return client, os.Getenv("DEDUP_CALLGRIND_PID")
}

// dedupKeys drops repeated keys from reqs, which a batch may not hold.
func dedupKeys(reqs []idempotency.ClaimRequest) []idempotency.ClaimRequest {
	seen := make(map[string]bool, len(reqs))
	out := reqs[:0:0]
	for _, r := range reqs {
		if !seen[r.Key] {
			seen[r.Key] = true
			out = append(out, r)
		}
	}
	return out
}

// callgrind runs callgrind_control with arg on pid, when pid is set.
func callgrind(b *testing.B, pid, arg string) {
	if pid == "" {
		return
	}
	if out, err := exec.Command("callgrind_control", arg, pid).CombinedOutput(); err != nil {
		b.Fatalf("callgrind_control %s %s: %v: %s", arg, pid, err, out)
	}
}

// redisCPU is the server's used_cpu_user + used_cpu_sys.
func redisCPU(b *testing.B, client *redis.Client) time.Duration {
	info, err := client.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", k, err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}
