// Package dedupworker makes Kafka and NATS JetStream handlers effectively
// once: each message's idempotency key is claimed in Redis before its
// handler runs, the claim's lease is renewed while the handler runs, and a
// redelivery of a completed key is acked with the stored result instead of
// running again.
//
// A handler author imports this package, one store package and one source
// package. A worker is a store, a source and a handler:
//
//	store, err := redisbackend.NewFromURL(ctx, "redis://127.0.0.1:6379/0", redisbackend.Options{})
//	src, err := natssource.New(js, natssource.Config{Stream: "ORDERS", Consumer: "orders"}) // transports/natssource
//	w, err := dedupworker.NewWorker(store, dedupworker.Config{Logger: log})
//	err = w.Handle("orders", src, dedupworker.HandlerFunc(ship), dedupworker.WithKey(dedupworker.JSONKey("id")))
//	err = w.Run(ctx)
//
// Handlers return a result, stored with the completed key, or an error:
// [Permanent] dead-letters the message at once, [RetryAfter] retries it
// after a delay, and any other error retries it with the backoff
// ([WithBackoff]) until [WithMaxAttempts] is reached. [ClaimOf] gives a
// running handler its claim's fence, for downstream systems that must
// reject a stale writer, and [Step] runs a part of a handler once per key
// across retries.
//
// The key is read from the Idempotency-Key header unless [WithKey] names
// other sources: [HeaderKey], [JSONKey], [KafkaKey], [NatsMsgID],
// [PayloadHash] or [KeyFrom].
//
// A [BatchHandler] ([BatchFunc]) does the work for a run of messages in one
// call, such as one produce call for all of them, and fills a [Result] per
// message: each message then completes, retries or dead-letters on its own,
// and [MessageContext] gives each one's claim. The Kafka source hands it a
// partition's contiguous run, the NATS source a fetch.
//
// Cross-cutting concerns stack: a [Middleware] wraps the handler
// ([Config.Middleware] for every handler, [WithMiddleware] for one, the
// first listed outermost) and runs after the claim, only when the handler
// does; [Config.Wrap] wraps each delivery's processing and sees every
// outcome, duplicates included, as consumer/tracing's span per delivery
// does. Metrics leave through [Config.Hooks] ([HookOutcome] and the other
// Hook* interfaces).
//
// For tests, idempotency/memstore is an in-memory store with the Redis
// store's semantics and consumer/consumertest an in-memory source (in runs,
// for a batch handler: Source.InRuns).
package dedupworker
