// Command nats is a complete small dedupworker program: a handler behind a
// JetStream durable consumer, made effectively once by the deduplication
// engine on Redis. It runs until SIGINT or SIGTERM and then drains.
//
// Try it with a local nats-server (-js) and Redis:
//
//	go run ./examples/nats -nats nats://127.0.0.1:4222 -redis redis://127.0.0.1:6379/0
//	nats pub orders.new '{"id":"o-1","amount":42}' -H Idempotency-Key:o-1
//	nats pub orders.new '{"id":"o-1","amount":42}' -H Idempotency-Key:o-1   # a duplicate: not run again
//
// The stream is created when it does not exist.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/redisbackend"
	natstr "github.com/idemkit/dedupworker/transports/nats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	var (
		natsURL     = flag.String("nats", nats.DefaultURL, "NATS server URL")
		redisURL    = flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL (redis:// or rediss://)")
		stream      = flag.String("stream", "ORDERS", "JetStream stream (created on orders.> when missing)")
		subject     = flag.String("subject", "orders.>", "subjects of the stream when it is created")
		durable     = flag.String("consumer", "orders-dedup", "durable consumer name (created when missing)")
		dlq         = flag.String("dlq", "dlq.orders", "dead-letter subject; empty for none")
		concurrency = flag.Int("concurrency", 16, "handlers running at once")
		lease       = flag.Duration("lease", 30*time.Second, "deduplication lease (also the consumer's AckWait)")
	)
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(log, *natsURL, *redisURL, *stream, *subject, *durable, *dlq, *concurrency, *lease); err != nil {
		log.Error("exiting", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, natsURL, redisURL, stream, subject, durable, dlq string, concurrency int, lease time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	nc, err := nats.Connect(natsURL, nats.Name("dedupworker-example"), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("nats disconnected", "err", err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrl()) }))
	if err != nil {
		return fmt.Errorf("connecting to NATS at %s: %w", natsURL, err)
	}
	defer nc.Close() // after Run: the Source flushed its acks when it stopped
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.Stream(sctx, stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(sctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}})
		if err != nil {
			return fmt.Errorf("creating stream %s: %w", stream, err)
		}
		log.Info("created stream", "stream", stream, "subjects", subject)
	} else if err != nil {
		return fmt.Errorf("looking up stream %s: %w", stream, err)
	}

	store, err := redisbackend.NewFromURL(sctx, redisURL, redisbackend.Options{Namespace: "example", Logger: log})
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }()
	engine, err := idempotency.New(store, idempotency.Config{Logger: log})
	if err != nil {
		return err
	}

	src, err := natstr.New(js, natstr.Config{
		Stream: stream, Consumer: durable, AckWait: lease, DeadLetterSubject: dlq, Logger: log,
	})
	if err != nil {
		return err
	}
	dedup, err := engine.Middleware(
		idempotency.WithLease(lease),
		idempotency.WithMaxAttempts(5),
		idempotency.WithBackoff(time.Second, time.Minute),
		// A repeated request gets the stored answer of the first run.
		idempotency.WithOnDuplicate(func(ctx context.Context, d consumer.Delivery, rec *idempotency.Record) error {
			err := src.Reply(ctx, d.Message(), rec.Result)
			if errors.Is(err, natstr.ErrNoReplySubject) {
				return nil
			}
			return err
		}),
	)
	if err != nil {
		return err
	}

	w := consumer.NewWorker(consumer.Config{Logger: log, ShutdownTimeout: 30 * time.Second})
	err = w.Handle("orders", src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		claim, _ := idempotency.FromContext(ctx)
		// The side effect: here it is a log line. Pass claim.Fence to a
		// downstream system so it can reject a stale writer.
		log.Info("processing order", "key", claim.Key, "fence", claim.Fence, "attempt", claim.Attempt, "origin", m.Origin.String(), "bytes", len(m.Payload))
		result := []byte("accepted " + claim.Key)
		if err := src.Reply(ctx, m, result); err != nil && !errors.Is(err, natstr.ErrNoReplySubject) {
			log.Warn("reply failed", "err", err)
		}
		return result, nil
	}), consumer.WithConcurrency(concurrency), consumer.WithMiddleware(dedup))
	if err != nil {
		return err
	}
	log.Info("running; SIGINT to stop", "nats", natsURL, "stream", stream, "consumer", durable)
	return w.Run(ctx)
}
