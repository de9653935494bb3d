// Package idempotency is the transport-neutral deduplication engine of
// dedupworker.
//
// For every delivery it extracts the message's idempotency key
// and payload fingerprint, claims the key in a Store (one round
// trip per fetched batch), and then, by the claim's outcome, runs
// the handler under a renewed lease, acks a duplicate without
// running it, waits for a key in flight elsewhere, or rejects a key reused for
// other content. A handler's result is stored before the delivery is acked;
// a result the store cannot take yet is held and its
// completion retried until it is stored, or the delivery's context ends
// (the worker's drain deadline), so a store outage does not run the handler
// again. Failures are retried with backoff and dead-lettered after max
// attempts.
//
// The root package, dedupworker, runs it for every handler its Worker
// deduplicates, and names what a handler uses (its options, key sources,
// ClaimOf and Step). This package is for those who write a [Store]
// (storetest is its conformance suite) and for the worker itself: its
// [Engine] makes the consumer.Processor of each handler.
//
// A handler's failure is retried after its backoff ([WithBackoff]) or
// dead-lettered once [WithMaxAttempts] is reached, or at once for a
// permanent error. Lease renewals are sent on [Config.Clock]; tests drive
// it with idempotencytest.Clock.
//
// # Batch handlers
//
// A handler that also implements consumer.BatchHandler is given the
// messages of a run that the engine owns in one HandleBatch call,
// when the source hands it a run (consumer.Runner.ProcessBatch:
// a Kafka lane's queued messages, a NATS fetch). Of the run, already claimed
// by Prepare:
//
//   - deliveries whose key it claimed NEW, RECLAIMED or RECOVERED go to the
//     handler, in order, in one call;
//   - duplicates and fingerprint mismatches are answered as for a single
//     delivery, and never reach the handler;
//   - a delivery that Prepare did not claim because it repeats a key of the
//     fetch, or whose claim found its key in flight (a producer retry or a
//     redelivery next to its original), is claimed again when the run
//     reaches it, and then taken as above. When a delivery of the pending
//     call owns its key it waits instead, and is processed as a single
//     delivery once that call has settled: a duplicate when the call
//     completed the key, or, when that message failed, a run on its own
//     after the call, as that message's retry would be;
//   - a delivery that cannot run at once (its key in flight elsewhere, a
//     claim gone stale, a store error, a missing key) cuts the run: the
//     deliveries before it run as one call, then it runs alone through
//     Handle as a single delivery does (waiting for the key's owner), then
//     the rest of the run.
//
// Each message of a call has its own context, dedupworker.MessageContext(ctx,
// i), carrying its claim (dedupworker.ClaimOf, dedupworker.Step) and cancelled when that claim's
// lease is lost; the lease of every claim of the call is renewed while the
// call runs. After the call each message completes, retries or is
// dead-lettered on its own, from its consumer.Result, by the same rules as
// a single delivery: one failure fails only its message. The completions of
// a call are submitted to the store together (one Complete call, unless
// other handlers' completions already fill a batch), and the deliveries are
// acked after them. When every message of the run's last call has a result
// to store and nothing of the run waits behind it, the engine tells the
// run's source so before it stores them (consumer.RunHandledNotifier): the Kafka
// source then starts the lane's next run while the completions are in
// flight. The completions may wait up to Config.CompletionLinger for
// other runs' to share their store call. A plain Handler's run of one (what
// a Kafka lane hands a handler that is not a BatchHandler) is told of and
// completed the same way. A panic in HandleBatch fails
// every message of the call
// with a *consumer.PanicError. In shadow mode every delivery goes through
// Handle, one at a time.
package idempotency
