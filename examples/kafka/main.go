// Command kafka is a complete small dedupworker program: a handler consuming
// a Kafka topic as a member of a consumer group, made effectively once by
// the deduplication engine on Redis. It runs until SIGINT or SIGTERM, then
// drains, commits and leaves the group.
//
// Try it with a Kafka broker and Redis:
//
//	go run ./examples/kafka -brokers 127.0.0.1:9092 -topic orders -redis redis://127.0.0.1:6379/0
//	echo 'o-1:{"id":"o-1","amount":42}' | kcat -P -b 127.0.0.1:9092 -t orders -K: -H Idempotency-Key=o-1
//	echo 'o-1:{"id":"o-1","amount":42}' | kcat -P -b 127.0.0.1:9092 -t orders -K: -H Idempotency-Key=o-1   # a duplicate: not run again
//
// Without a broker, -embedded starts an in-process Kafka-protocol broker
// (franz-go's kfake) with the topic and produces a few messages with
// duplicates to it, so the program shows the whole flow on its own:
//
//	go run ./examples/kafka -embedded
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/redisbackend"
	"github.com/idemkit/dedupworker/transports/kafka"
)

func main() {
	var (
		brokers     = flag.String("brokers", "127.0.0.1:9092", "comma-separated Kafka bootstrap brokers")
		topic       = flag.String("topic", "orders", "topic to consume")
		group       = flag.String("group", "orders-dedup", "consumer group")
		redisURL    = flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL (redis:// or rediss://)")
		dlq         = flag.String("dlq", "orders.dlq", "dead-letter topic; empty for none")
		ordering    = flag.String("ordering", kafka.OrderingPartition, "partition or key")
		concurrency = flag.Int("concurrency", 16, "handlers running at once across partitions")
		lease       = flag.Duration("lease", 30*time.Second, "deduplication lease")
		namespace   = flag.String("namespace", "example-kafka", "Redis namespace of the deduplication records")
		embedded    = flag.Bool("embedded", false, "run against an in-process broker seeded with sample messages")
	)
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	addrs := strings.Split(*brokers, ",")
	if *embedded {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, *topic, *dlq))
		if err != nil {
			log.Error("starting the in-process broker", "err", err)
			os.Exit(1)
		}
		defer c.Close()
		addrs = c.ListenAddrs()
		if err := seed(ctx, addrs, *topic); err != nil {
			log.Error("seeding", "err", err)
			os.Exit(1)
		}
		// A fresh broker: fresh records too, or the sample keys of an
		// earlier run would all be duplicates.
		*namespace = fmt.Sprintf("%s-%d", *namespace, time.Now().UnixNano())
		log.Info("in-process broker", "brokers", addrs, "topic", *topic, "namespace", *namespace)
	}
	if err := run(ctx, log, addrs, *topic, *group, *redisURL, *namespace, *dlq, *ordering, *concurrency, *lease); err != nil {
		log.Error("exiting", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, brokers []string, topic, group, redisURL, namespace, dlq, ordering string, concurrency int, lease time.Duration) error {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	store, err := redisbackend.NewFromURL(sctx, redisURL, redisbackend.Options{Namespace: namespace, Logger: log})
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }()
	engine, err := idempotency.New(store, idempotency.Config{Logger: log})
	if err != nil {
		return err
	}
	dedup, err := engine.Middleware(
		idempotency.WithLease(lease),
		idempotency.WithMaxAttempts(5),
		idempotency.WithBackoff(time.Second, time.Minute),
	)
	if err != nil {
		return err
	}

	src, err := kafka.New(kafka.Config{
		Brokers:         brokers,
		Topic:           topic,
		GroupID:         group,
		Ordering:        ordering,
		DeadLetterTopic: dlq,
		Logger:          log,
	})
	if err != nil {
		return err
	}

	w := consumer.NewWorker(consumer.Config{Logger: log, ShutdownTimeout: 30 * time.Second})
	err = w.Handle("orders", src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		claim, _ := idempotency.FromContext(ctx)
		// The side effect: here a log line. Pass claim.Fence to a downstream
		// system so it can reject a stale writer.
		log.Info("processing order", "key", claim.Key, "fence", claim.Fence, "attempt", claim.Attempt,
			"origin", m.Origin.String(), "bytes", len(m.Payload))
		return []byte("accepted " + claim.Key), nil
	}), consumer.WithConcurrency(concurrency), consumer.WithMiddleware(dedup))
	if err != nil {
		return err
	}
	log.Info("running; SIGINT to stop", "brokers", brokers, "topic", topic, "group", group)
	return w.Run(ctx)
}

// seed produces six messages carrying three idempotency keys: the handler
// runs three times, the other three are acknowledged as duplicates.
func seed(ctx context.Context, brokers []string, topic string) error {
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond, Balancer: &kafkago.RoundRobin{}}
	defer w.Close()
	var msgs []kafkago.Message
	for i := range 6 {
		id := fmt.Sprintf("o-%d", i%3+1)
		msgs = append(msgs, kafkago.Message{
			Key:     []byte("customer-1"),
			Value:   fmt.Appendf(nil, `{"id":%q}`, id),
			Headers: []kafkago.Header{{Key: "Idempotency-Key", Value: []byte(id)}},
		})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return w.WriteMessages(ctx, msgs...)
}
