// Command kafka runs a handler in a Kafka consumer group, effectively once, until SIGTERM:
//
//	go run ./examples/kafka   # $KAFKA_BROKERS and $REDIS_URL, default local servers
//	echo 'o-1:{"id":"o-1"}' | kcat -P -b 127.0.0.1:9092 -t orders -K: -H Idempotency-Key=o-1
//	echo 'o-1:{"id":"o-1"}' | kcat -P -b 127.0.0.1:9092 -t orders -K: -H Idempotency-Key=o-1   # a duplicate
package main

import (
	"cmp"
	"context"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/idemkit/dedupworker"
	"github.com/idemkit/dedupworker/redisbackend"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	store, err := redisbackend.NewFromURL(ctx, cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"), redisbackend.Options{Namespace: "example"})
	check(log, err)
	defer store.Close()
	src, err := kafkasource.New(kafkasource.Config{
		Brokers: strings.Split(cmp.Or(os.Getenv("KAFKA_BROKERS"), "127.0.0.1:9092"), ","),
		Topic:   "orders", GroupID: "orders-dedup", DeadLetterTopic: "orders.dlq", Logger: log,
	})
	check(log, err)
	w, err := dedupworker.NewWorker(store, dedupworker.Config{Logger: log})
	check(log, err)
	check(log, w.Handle("orders", src, dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
		claim, _ := dedupworker.ClaimOf(ctx)
		// The side effect; claim.Fence lets a downstream refuse a stale writer.
		log.Info("processing order", "key", claim.Key, "fence", claim.Fence, "origin", m.Origin.String())
		return []byte("accepted " + claim.Key), nil
	}), dedupworker.WithConcurrency(16)))
	check(log, w.Run(ctx)) // drains, commits and leaves the group
}

func check(log *slog.Logger, err error) {
	if err != nil {
		log.Error("exiting", "err", err)
		os.Exit(1)
	}
}
