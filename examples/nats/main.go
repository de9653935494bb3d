// Command nats runs a handler on a JetStream durable, effectively once, until SIGTERM.
// With Redis on 6379 and nats-server -js on 4222, the binary creates the streams
// (ORDERS on orders.new, DLQ_ORDERS on dlq.orders) and publishes test messages:
//
//	go run ./cmd/dedupworker setup -c examples/config/nats-relay.yaml
//	go run ./examples/nats   # $NATS_URL and $REDIS_URL, default local servers
//	go run ./cmd/dedupworker publish -c examples/config/nats-relay.yaml --handler orders --key o-1 '{"id":"o-1"}'
//	go run ./cmd/dedupworker publish -c examples/config/nats-relay.yaml --handler orders --key o-1 '{"id":"o-1"}'   # a duplicate: not run again
package main

import (
	"cmp"
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker"
	"github.com/idemkit/dedupworker/redisbackend"
	"github.com/idemkit/dedupworker/transports/natssource"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	nc, err := nats.Connect(cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), nats.MaxReconnects(-1))
	check(log, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	check(log, err)
	store, err := redisbackend.NewFromURL(ctx, cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"), redisbackend.Options{Namespace: "example"})
	check(log, err)
	defer store.Close()
	src, err := natssource.New(js, natssource.Config{Stream: "ORDERS", Consumer: "orders", DeadLetterSubject: "dlq.orders"})
	check(log, err)
	w, err := dedupworker.NewWorker(store, dedupworker.Config{Logger: log})
	check(log, err)
	check(log, w.Handle("orders", src, dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
		claim, _ := dedupworker.ClaimOf(ctx)
		// The side effect; claim.Fence lets a downstream refuse a stale writer.
		log.Info("processing order", "key", claim.Key, "fence", claim.Fence, "attempt", claim.Attempt, "bytes", len(m.Payload))
		return []byte("accepted " + claim.Key), nil
	}), dedupworker.WithKey(dedupworker.HeaderKey("Idempotency-Key"), dedupworker.JSONKey("id"))))
	check(log, w.Run(ctx))
}

func check(log *slog.Logger, err error) {
	if err != nil {
		log.Error("exiting", "err", err)
		os.Exit(1)
	}
}
