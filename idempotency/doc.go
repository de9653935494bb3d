// Package idempotency is the transport-neutral deduplication engine of
// dedupworker.
//
// For every delivery it extracts the message's idempotency key (SPEC §3.1)
// and payload fingerprint (SPEC §3.3), claims the key in a Store (one round
// trip per fetched batch, SPEC §4.4), and then, by the claim's outcome, runs
// the handler under a renewed lease (SPEC §6), acks a duplicate without
// running it, waits for a key in flight elsewhere, or rejects a key reused for
// other content. A handler's result is stored before the delivery is acked
// (SPEC §5.2); failures are retried with backoff and dead-lettered after
// max attempts (SPEC §7).
//
// The engine plugs into a consumer.Worker as middleware:
//
//	store, _ := redisbackend.NewFromURL(ctx, "redis://127.0.0.1:6379/0", redisbackend.Options{})
//	engine, _ := idempotency.New(store, idempotency.Config{Logger: logger})
//	mw, err := engine.Middleware(idempotency.WithLease(30*time.Second), idempotency.WithMaxAttempts(5))
//	w := consumer.NewWorker(consumer.Config{Logger: logger})
//	w.Handle("orders", source, handler, consumer.WithMiddleware(mw))
//	err = w.Run(ctx)
//
// Inside a handler, FromContext tells the claim (key, fence, attempt) and
// Step makes single side effects survive a retry without repeating.
package idempotency
