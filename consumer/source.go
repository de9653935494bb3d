package consumer

import "context"

// Processor takes a delivery from receipt to settlement: it runs the work and
// then Acks or Naks the delivery. Process must not return before the delivery
// is settled, unless ctx is cancelled, in which case it settles the delivery
// as best it can (Nak without delay) and returns promptly.
type Processor interface {
	Process(ctx context.Context, d Delivery)
}

// ProcessorFunc adapts a function to Processor.
type ProcessorFunc func(ctx context.Context, d Delivery)

// Process calls f(ctx, d).
func (f ProcessorFunc) Process(ctx context.Context, d Delivery) { f(ctx, d) }

// BatchPreparer is implemented by a Processor that wants to see every fetched
// batch before its deliveries are processed, for example to claim all their
// idempotency keys in one Redis round trip. Sources call it through
// Runner.Prepare. Every delivery passed to PrepareBatch is afterwards passed to
// Process exactly once (with a cancelled context if the worker is stopping),
// so per-delivery state kept by PrepareBatch is always consumed.
type BatchPreparer interface {
	PrepareBatch(ctx context.Context, batch []Delivery)
}

// Middleware turns a named Handler into a Processor. The name is the
// handler's scope (SPEC §2). The deduplication engine is a Middleware
// (idempotency.Engine.Middleware); Direct is the one without deduplication.
type Middleware func(name string, next Handler) Processor

// Source is a transport: it fetches deliveries and schedules them on a
// Runner, honouring the runner's concurrency and the transport's ordering
// rules (Kafka: offset order per partition; NATS: any order).
//
// Consume runs until ctx is cancelled or the source cannot continue. On
// cancellation it stops fetching, waits for every delivery it handed to
// Runner.Process to return, finishes its own bookkeeping (Kafka: commit the
// watermark) and returns nil. It returns a non-nil error only when it cannot
// go on (a deleted stream, refused credentials), naming the cause.
//
// The context passed to Runner.Process must not be ctx itself: stopping the
// fetch is not stopping the work. Pass context.WithoutCancel(ctx), or a
// context cancelled only for that delivery's own reasons (a revoked Kafka
// partition). The worker adds its shutdown deadline to it.
type Source interface {
	Consume(ctx context.Context, r Runner) error
}

// Runner is what a Worker hands a Source: the processing of one registered
// handler.
type Runner interface {
	// Name is the handler's name.
	Name() string
	// Concurrency is how many deliveries the source may have in Process at
	// once (NATS: MaxAckPending follows it; Kafka: the cap across a member's
	// partitions and keys).
	Concurrency() int
	// Prepare shows a fetched batch to the processor (batch claims). Sources
	// call it once per fetched batch, before processing its deliveries.
	Prepare(ctx context.Context, batch []Delivery)
	// Process runs one delivery to settlement. It blocks while it runs.
	Process(ctx context.Context, d Delivery)
	// ProcessBatch runs a contiguous run of deliveries to settlement, each
	// settled on its own; it blocks while they run. The run holds one of
	// Concurrency's slots for the whole call: a batch handler call is one
	// unit of work, however many messages it carries. A processor that is
	// not a BatchProcessor gets the deliveries one at a time, in order,
	// under that one slot. Every delivery of ds has Process's contract
	// (with a cancelled ctx it is settled as best it can).
	ProcessBatch(ctx context.Context, ds []Delivery)
	// Batching reports whether ProcessBatch gives the handler runs at once
	// (a BatchHandler behind a BatchProcessor). When it is false, a run is
	// processed one delivery after another: a source with no order to keep
	// (NATS) should then call Process for each delivery concurrently.
	Batching() bool
}
