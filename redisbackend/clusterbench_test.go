package redisbackend_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/redisbackend"
)

// BenchmarkClusterEngine measures the engine and the Redis store on a
// private, healthy Redis Cluster of 3 primaries, as a relay uses them:
// fetches of 100 new keys, each fetch prepared (its claims sent together)
// and its deliveries processed on up to 64 goroutines, a no-op handler,
// their completions batched. msgs/s is the rate; cpu-µs/msg the CPU time
// (user and system) of the benchmark process per message, and
// redis-cpu-µs/msg the CPU time of the three redis-servers per message;
// trips/msg the round trips to a primary (one pipeline or command on one
// node) and calls/msg the commands, per message.
func BenchmarkClusterEngine(b *testing.B) {
	c := startPrivateCluster(b, 3, false)
	client := c.clusterClient(b, "")
	hook := &countHook{} // counts on the primaries' own clients: a round trip is one node's
	client.OnNewNode(func(rdb *redis.Client) { rdb.AddHook(hook) })
	store := newStore(b, client, redisbackend.Options{})
	eng, err := idempotency.New(store, idempotency.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = eng.Close() })
	dedup, err := eng.Processor()
	if err != nil {
		b.Fatal(err)
	}
	p := dedup("bench", consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil }))
	ctx := context.Background()
	const fetch, concurrency = 100, 64
	slots := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	seq := 0
	run := func(n int) {
		for sent := 0; sent < n; {
			m := min(fetch, n-sent)
			ds := make([]consumer.Delivery, m)
			for i := range ds {
				k := strconv.Itoa(seq)
				seq++
				ds[i] = consumertest.NewDelivery(consumertest.NewMessage(k, k), 1)
			}
			p.Prepare(ctx, ds)
			for _, d := range ds {
				slots <- struct{}{}
				wg.Go(func() {
					defer func() { <-slots }()
					p.Process(ctx, d)
					if st, _ := d.(*consumertest.Delivery).Settled(); st != consumertest.Acked {
						b.Errorf("delivery settled %q, want acked", st)
					}
				})
			}
			sent += m
		}
		wg.Wait()
	}
	run(2 * fetch) // load the scripts, warm the pools
	hook.cmds.Store(0)
	hook.trips.Store(0)
	redis0 := c.redisCPU(b)
	cpu0 := processCPU()
	start := time.Now()
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	took := time.Since(start)
	cpu := processCPU() - cpu0
	rcpu := c.redisCPU(b) - redis0
	b.ReportMetric(float64(b.N)/took.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/msg")
	b.ReportMetric(float64(rcpu.Microseconds())/float64(b.N), "redis-cpu-µs/msg")
	b.ReportMetric(float64(hook.trips.Load())/float64(b.N), "trips/msg")
	b.ReportMetric(float64(hook.cmds.Load())/float64(b.N), "calls/msg")
}

// processCPU is the CPU time, user and system, this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is the CPU time, user and system, the cluster's primaries have
// used (INFO cpu).
func (c *privateCluster) redisCPU(t testing.TB) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var total float64
	for _, m := range c.masters {
		info, err := m.client.Info(ctx, "cpu").Result()
		if err != nil {
			t.Fatalf("INFO cpu on %s: %v", m.addr(), err)
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("INFO cpu on %s: %s: %v", m.addr(), line, err)
				}
				total += f
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}
