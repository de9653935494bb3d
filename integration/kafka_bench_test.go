package integration_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// kafkaCountOutcomes counts settled deliveries (consumer.HookOutcome).
type kafkaCountOutcomes struct{ n atomic.Int64 }

func (c *kafkaCountOutcomes) OnOutcome(_, _ string, o consumer.Outcome) {
	switch o {
	case consumer.OutcomeProcessed, consumer.OutcomeDuplicate:
		c.n.Add(1)
	}
}

// BenchmarkKafkaThroughput compares, on one broker in one run, messages per
// second through a plain kafka-go group Reader that only fetches and commits
// (CommitInterval 1s) with the Worker over this Source: without
// deduplication, and with the engine on Redis, without duplicates and with
// 3 in 10 messages repeating a key. Each iteration consumes a fresh topic of 20,000 messages on 8 partitions
// with a fresh group; the time runs from the start of consuming until every
// message is settled and the consumer has stopped (final commit included).
//
//	go test ./integration -run '^$' -bench KafkaThroughput -benchtime 3x
func BenchmarkKafkaThroughput(b *testing.B) {
	const total, parts = 20000, 8
	brokers := testenv.Kafka(b)
	for _, tc := range []struct {
		name string
		dups int
		run  func(b *testing.B, h *kafkaHarness, n int) time.Duration
	}{
		{"reader-commit-only/dup=0%", 0, kafkaBenchReader},
		{"worker-no-dedup/dup=0%", 0, kafkaBenchWorker(false)},
		{"worker-dedup/dup=0%", 0, kafkaBenchWorker(true)},
		{"worker-dedup/dup=30%", total * 3 / 10, kafkaBenchWorker(true)},
		{"worker-dedup-key-ordering/dup=0%", 0, kafkaBenchWorkerKeyed},
		{"worker-dedup-key-ordering/dup=30%", total * 3 / 10, kafkaBenchWorkerKeyed},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var elapsed time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				h := &kafkaHarness{brokers: brokers, ns: "bench-" + testenv.RandID()}
				h.topic = "bench-" + h.ns
				h.group = h.topic + "-g"
				h.createTopic(b, h.topic, parts)
				h.produce(b, h.topic, kafkaPlanWithDuplicates(total-tc.dups, tc.dups, parts))
				b.StartTimer()
				elapsed += tc.run(b, h, total)
			}
			b.ReportMetric(float64(total*b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

func kafkaBenchReader(b *testing.B, h *kafkaHarness, n int) time.Duration {
	start := time.Now()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: h.brokers, GroupID: h.group, Topic: h.topic,
		MaxWait: 100 * time.Millisecond, CommitInterval: time.Second,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seen := map[[2]int64]bool{}
	for len(seen) < n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		seen[[2]int64{int64(m.Partition), m.Offset}] = true
		if err := r.CommitMessages(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// kafkaBenchWorkerKeyed runs with key ordering: the benchmark's messages
// carry no Kafka key, so nothing orders them and they run 16 at a time.
func kafkaBenchWorkerKeyed(b *testing.B, h *kafkaHarness, n int) time.Duration {
	return kafkaBenchWorkerWith(true, kafkasource.OrderingKey)(b, h, n)
}

func kafkaBenchWorker(dedup bool) func(b *testing.B, h *kafkaHarness, n int) time.Duration {
	return kafkaBenchWorkerWith(dedup, kafkasource.OrderingPartition)
}

func kafkaBenchWorkerWith(dedup bool, ordering string) func(b *testing.B, h *kafkaHarness, n int) time.Duration {
	return func(b *testing.B, h *kafkaHarness, n int) time.Duration {
		b.StopTimer()
		src, err := kafkasource.New(kafkasource.Config{
			Brokers: h.brokers, Topic: h.topic, GroupID: h.group,
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
			MaxWait: 100 * time.Millisecond, Ordering: ordering,
		})
		if err != nil {
			b.Fatal(err)
		}
		count := &kafkaCountOutcomes{}
		opts := []dispatch.HandleOption{dispatch.WithConcurrency(16)}
		if dedup {
			store := newKafkaStore(b, h.ns)
			testenv.DropNamespace(b, h.ns)
			engine, err := idempotency.New(store, idempotency.Config{Hooks: consumer.Hooks{count}})
			if err != nil {
				b.Fatal(err)
			}
			dedup, err := engine.Processor()
			if err != nil {
				b.Fatal(err)
			}
			opts = append(opts, dispatch.WithProcessor(dedup))
		}
		w := dispatch.NewWorker(dispatch.Config{Hooks: consumer.Hooks{count}})
		if err := w.Handle("bench", src, consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) {
			return nil, nil
		}), opts...); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { done <- w.Run(ctx) }()
		deadline := time.After(2 * time.Minute)
		for count.n.Load() < int64(n) {
			select {
			case err := <-done:
				cancel()
				b.Fatalf("Run returned early: %v", err)
			case <-deadline:
				cancel()
				b.Fatalf("only %d of %d messages settled in 2 minutes", count.n.Load(), n)
			case <-time.After(time.Millisecond):
			}
		}
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		elapsed := time.Since(start)
		if got := count.n.Load(); got != int64(n) {
			b.Fatalf("%d settled outcomes, want %d", got, n)
		}
		return elapsed
	}
}
