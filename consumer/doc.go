// Package consumer is the contract between dedupworker and the code that
// plugs into it: for those who write a transport (a [Source] and its
// [Delivery]), a processor or a [ProcessorWrapper], or a store's hooks. A
// handler author does not import it: the root package, dedupworker, names
// everything a handler uses (Message, Handler, BatchHandler, Middleware,
// Permanent, RetryAfter, the Worker and its options).
//
// The package imports only the standard library. Transports implement
// [Source] and [Delivery], and hand each fetched delivery to the [Runner]
// the worker gives them; the deduplication engine is the [Processor] of
// every deduplicated handler. The worker itself, and what only it and the
// engine call, are internal to the module.
//
// Cross-cutting concerns stack at two levels. A Middleware wraps the
// Handler (logging, metrics of the handler's own work) and runs only when
// the handler does; a ProcessorWrapper (the worker's Config.Wrap) wraps
// the Processor and sees every delivery and its outcome, duplicates included (a trace span per
// delivery, package consumer/tracing). A Processor carries every method of
// its contract (Prepare, Process, ProcessBatch, Batching), so no wrapper can
// drop batch claims or runs.
//
// A handler chooses the fate of a failed message with the error it returns:
// a [PermanentError] dead-letters it, a [RetryError] retries it after its
// Delay, any other error retries it with the backoff. A processor honours
// both.
//
// # Batch handlers
//
// A Handler that also implements BatchHandler (BatchFunc makes one from a
// function) does the work for a run of messages in one call, for example
// one produce call for all of them, and fills a Result per message. Sources
// hand runs to Runner.ProcessBatch: the Kafka source a lane's queued
// contiguous run (a partition's under partition ordering, a key's under key
// ordering, at most BatchSize), the NATS source each fetched batch.
// [Processor]s that are not Batching, and handlers that are not
// BatchHandlers, get the run one delivery at a time, in order (the NATS
// source then keeps calling Process concurrently: Runner.Batching). A run
// holds one Concurrency slot for the whole call. A processor that knows when
// a run's handlers are done, before it has stored their results, tells the
// run's source ([RunHandledNotifier]): the Kafka source then starts the lane's
// next run while the first call stores them. So that a lane of a plain
// handler overlaps the same way, the Kafka source hands a processor that is
// not Batching runs of one delivery through ProcessBatch.
//
// Every message of a run is settled on its own from its Result: one failed
// message is retried or dead-lettered alone. On Kafka a nakked message holds
// back the rest of its lane as it does for a single handler: the lane
// retries the run's nakked messages, in order and after their delay, before
// it takes its next run, and the committed offset never passes an
// unfinished message. The messages after a failed one in the same run have
// already run by then: a batch handler sees them together.
package consumer
