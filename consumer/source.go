package consumer

import "context"

// Processor takes a handler's deliveries from receipt to settlement: it runs
// the work and then Acks or Naks each delivery. The deduplication engine
// (idempotency.Engine.Processor) and the at-least-once processor used
// without one are Processors; a ProcessorWrapper (tracing) wraps one.
//
// Every method is part of the contract, so a wrapper forwards all of them,
// explicitly or by embedding the Processor it wraps: none can be dropped
// without a compile error, and none is discovered by a type assertion. A
// wrapper that embeds its Processor and overrides Process overrides
// ProcessBatch too, or runs reach the inner Processor without passing
// through the wrapper.
type Processor interface {
	// Prepare sees a fetched batch before its deliveries are processed, for
	// example to claim all their idempotency keys in one Redis round trip.
	// Sources call it through Runner.Prepare. Every delivery passed to
	// Prepare is afterwards passed to Process or ProcessBatch exactly once
	// (with a cancelled context if the worker is stopping), so per-delivery
	// state kept by Prepare is always consumed. A processor with nothing to
	// prepare returns at once.
	Prepare(ctx context.Context, batch []Delivery)
	// Process runs one delivery to settlement. It must not return before the
	// delivery is settled, unless ctx is cancelled, in which case it settles
	// the delivery as best it can (Nak without delay) and returns promptly.
	Process(ctx context.Context, d Delivery)
	// ProcessBatch runs a contiguous run of deliveries to settlement, each
	// delivery settled on its own (Ack, Nak, or dead-letter and Ack),
	// keeping their order where the handler's side effects are concerned.
	// It has Process's contract for every delivery of ds, including a
	// cancelled ctx. A wrapper that gives each delivery a context of its
	// own passes them with WithDeliveryContexts. A processor that can tell
	// when a run's handlers are done while its results are still being
	// stored calls RunHandled (see RunHandledNotifier).
	ProcessBatch(ctx context.Context, ds []Delivery)
	// Batching reports whether ProcessBatch hands runs to a BatchHandler;
	// when false it processes the deliveries one at a time, in order.
	Batching() bool
}

// ProcessorFunc adapts a function to a Processor that prepares nothing and
// processes a run one delivery at a time, in order, each on its
// DeliveryContext.
type ProcessorFunc func(ctx context.Context, d Delivery)

// Prepare does nothing: a ProcessorFunc has no batch state.
func (f ProcessorFunc) Prepare(context.Context, []Delivery) {}

// Process calls f(ctx, d).
func (f ProcessorFunc) Process(ctx context.Context, d Delivery) { f(ctx, d) }

// ProcessBatch calls f for each delivery of ds, in order.
func (f ProcessorFunc) ProcessBatch(ctx context.Context, ds []Delivery) {
	for _, d := range ds {
		f(DeliveryContext(ctx, d), d)
	}
}

// Batching reports false: a ProcessorFunc takes one delivery at a time.
func (f ProcessorFunc) Batching() bool { return false }

// ProcessorFactory makes the Processor of a named handler; the name is the
// handler's scope. h is the handler with its middleware applied.
// The deduplication engine is one (idempotency.Engine.Processor); a Worker
// uses it through WithProcessor.
type ProcessorFactory func(name string, h Handler) Processor

// ProcessorWrapper wraps the Processor of a named handler, for what must see
// every delivery from receipt to settlement and its outcome, such as a trace
// span per delivery (package consumer/tracing). Handler-level concerns
// (logging, metrics of the handler's own work) are a Middleware instead.
type ProcessorWrapper func(name string, next Processor) Processor

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
	// Concurrency is how many calls the source may have in Process or
	// ProcessBatch at once, a run counting as one (NATS: the default
	// MaxAckPending follows it, times the batch size when the runner
	// batches; Kafka: the cap across a member's partitions and keys).
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
	// not Batching takes the deliveries one at a time, in order, under that
	// one slot. Every delivery of ds has Process's contract (with a
	// cancelled ctx it is settled as best it can). A source that keeps an
	// order may pass deliveries that are RunHandledNotifiers, to learn when
	// it may start the run after this one.
	ProcessBatch(ctx context.Context, ds []Delivery)
	// Batching reports whether ProcessBatch gives the handler runs at once
	// (Processor.Batching: a BatchHandler behind a processor that hands it
	// runs). When it is false, a run is processed one delivery after
	// another: a source with no order to keep (NATS) should then call
	// Process for each delivery concurrently.
	Batching() bool
}
