package integration_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// BenchmarkWorkerVsPlain measures messages per second through the Worker
// with deduplication on Redis against a plain Consume-and-Ack loop, on the
// same stream in the same run, without duplicates and with 3 in 10
// messages repeating a key. b.N is the number of messages; run with -benchtime=20000x. The figures are the
// custom metrics plain_msgs/s, direct_msgs/s (the Worker and
// this Source without deduplication) and worker_msgs/s (with it).
func BenchmarkWorkerVsPlain(b *testing.B) {
	for _, srv := range testenv.NATSServers() {
		for _, dupPct := range []int{0, 30} {
			b.Run(fmt.Sprintf("%s/dups=%d%%", srv.Name, dupPct), func(b *testing.B) {
				h := newNATSHarness(b, srv.URL(b))
				n := max(b.N, 100)
				dups := n * dupPct / 100
				plan := natsPlanWithDuplicates(n-dups, dups)
				h.publish(b, plan)
				b.ResetTimer()

				plain := benchPlain(b, h, n)
				direct := benchDirect(b, h, n)
				worker := benchWorker(b, h, n)
				b.StopTimer()
				b.ReportMetric(float64(n)/direct.Seconds(), "direct_msgs/s")
				b.ReportMetric(float64(n)/plain.Seconds(), "plain_msgs/s")
				b.ReportMetric(float64(n)/worker.Seconds(), "worker_msgs/s")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// benchPlain consumes n messages with jetstream's Consume and acks each.
func benchPlain(b *testing.B, h *natsHarness, n int) time.Duration {
	ctx := natsCtx(b, time.Minute)
	cons, err := h.js.CreateConsumer(ctx, h.stream, jetstream.ConsumerConfig{Durable: "plain", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
	if err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	done := make(chan struct{})
	start := time.Now()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if err := m.Ack(); err != nil {
			b.Error(err)
		}
		if got.Add(1) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		info, err := cons.Info(natsCtx(b, 5*time.Second))
		b.Fatalf("plain: %d of %d: %+v %v", got.Load(), n, info, err)
	}
	took := time.Since(start)
	cc.Stop()
	<-cc.Closed()
	return took
}

// benchDirect runs the Worker without deduplication (at least once) until
// all n messages are acked: the transport's own cost.
func benchDirect(b *testing.B, h *natsHarness, n int) time.Duration {
	var settled atomic.Int64
	done := make(chan struct{})
	count := consumerOutcomeFunc(func(consumer.Outcome) {
		if settled.Add(1) == int64(n) {
			close(done)
		}
	})
	src, err := natssource.New(h.js, natssource.Config{Stream: h.stream, Consumer: "direct", FetchMaxWait: 200 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	w := dispatch.NewWorker(dispatch.Config{Hooks: consumer.Hooks{count}})
	handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) { return nil, nil })
	if err := w.Handle("direct", src, handler, dispatch.WithConcurrency(64)); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	start := time.Now()
	go func() { res <- w.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("direct: %d of %d", settled.Load(), n)
	}
	took := time.Since(start)
	cancel()
	if err := <-res; err != nil {
		b.Fatal(err)
	}
	return took
}

// benchWorker runs the deduplicating Worker until all n messages are acked.
func benchWorker(b *testing.B, h *natsHarness, n int) time.Duration {
	var settled atomic.Int64
	done := make(chan struct{})
	count := consumerOutcomeFunc(func(consumer.Outcome) {
		if settled.Add(1) == int64(n) {
			close(done)
		}
	})
	handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) { return nil, nil })
	start := time.Now()
	r := h.start(b, natsWorkerSpec{consumer: "dedup", handler: handler, concurrency: 64, hooks: consumer.Hooks{count}})
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("worker: %d of %d", settled.Load(), n)
	}
	took := time.Since(start)
	if err := r.Stop(b, time.Minute); err != nil {
		b.Fatal(err)
	}
	return took
}

// consumerOutcomeFunc adapts a function to consumer.HookOutcome.
type consumerOutcomeFunc func(consumer.Outcome)

func (f consumerOutcomeFunc) OnOutcome(_, _ string, o consumer.Outcome) { f(o) }
