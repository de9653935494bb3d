package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/dedupworker/consumer"
)

// Tracer starts delivery spans.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// New returns a Tracer over tp, propagating W3C trace context and baggage.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{
		tracer: tp.Tracer("github.com/idemkit/dedupworker"),
		prop:   propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
}

// Propagator is what forward actions inject into outgoing messages.
func (t *Tracer) Propagator() propagation.TextMapPropagator { return t.prop }

// HeaderCarrier adapts consumer.Header to propagation.TextMapCarrier.
type HeaderCarrier consumer.Header

// Get returns the first value of key, in any case.
func (c HeaderCarrier) Get(key string) string { return consumer.Header(c).Get(key) }

// Set replaces key.
func (c HeaderCarrier) Set(key, value string) { consumer.Header(c).Set(key, value) }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Attribute keys of a delivery span.
const (
	AttrHandler = attribute.Key("dedup.handler")
	AttrOutcome = attribute.Key("dedup.outcome")
	AttrKeyHash = attribute.Key("dedup.key_hash")
	AttrFence   = attribute.Key("dedup.fence")
	AttrAttempt = attribute.Key("dedup.attempt")
)

// Wrap returns next with a span around every delivery; it is a
// consumer.ProcessorWrapper (dedupworker.Config.Wrap).
// The span is a child of the message's traceparent, if any, and the
// handler's context carries it. Wrap forwards every method of next: next
// still sees each fetched batch (Prepare) and takes runs (ProcessBatch), in
// which each delivery keeps a span of its own (consumer.DeliveryContext).
func (t *Tracer) Wrap(handler string, next consumer.Processor) consumer.Processor {
	return &traced{t: t, handler: handler, next: next}
}

type traced struct {
	t       *Tracer
	handler string
	next    consumer.Processor
}

// Prepare shows the batch to next.
func (t *traced) Prepare(ctx context.Context, batch []consumer.Delivery) {
	t.next.Prepare(ctx, batch)
}

// Batching reports whether next hands runs to its handler.
func (t *traced) Batching() bool { return t.next.Batching() }

// ProcessBatch runs ds through next in one call, each delivery in a span of
// its own.
func (t *traced) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	if !t.next.Batching() {
		if len(ds) == 1 {
			// A plain handler's run of one, which next may report handled
			// before it returns (consumer.RunHandledNotifier).
			ctx, end := t.begin(ctx, ds[0])
			defer end()
			t.next.ProcessBatch(ctx, ds)
			return
		}
		for _, d := range ds {
			t.Process(ctx, d)
		}
		return
	}
	ctxs := make(map[consumer.Delivery]context.Context, len(ds))
	ends := make([]func(), len(ds))
	for i, d := range ds {
		ctxs[d], ends[i] = t.begin(ctx, d)
	}
	t.next.ProcessBatch(consumer.WithDeliveryContexts(ctx, ctxs), ds)
	for _, end := range ends {
		end()
	}
}

// Process runs d through next inside d's span.
func (t *traced) Process(ctx context.Context, d consumer.Delivery) {
	ctx, end := t.begin(ctx, d)
	defer end()
	t.next.Process(ctx, d)
}

// begin starts d's span and returns the context to process d on, and what
// ends the span with the outcome next observed.
func (t *traced) begin(ctx context.Context, d consumer.Delivery) (context.Context, func()) {
	m := d.Message()
	if m.Header != nil {
		ctx = t.t.prop.Extract(ctx, HeaderCarrier(m.Header))
	}
	ctx, span := t.t.tracer.Start(ctx, t.handler+" process",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			AttrHandler.String(t.handler),
			semconv.MessagingSystemKey.String(m.Origin.Transport),
			semconv.MessagingDestinationName(m.Origin.Topic),
			semconv.MessagingOperationTypeDeliver,
		))
	ctx, obs := consumer.WithObservation(ctx)
	return ctx, func() { t.end(span, obs) }
}

func (t *traced) end(span trace.Span, obs *consumer.Observation) {
	defer span.End()
	span.SetAttributes(AttrOutcome.String(string(obs.Outcome)))
	if obs.KeyHash != "" {
		span.SetAttributes(AttrKeyHash.String(obs.KeyHash))
	}
	if obs.Fence > 0 {
		span.SetAttributes(AttrFence.Int64(obs.Fence), AttrAttempt.Int(obs.Attempt))
	}
	switch obs.Outcome {
	case consumer.OutcomeFailed, consumer.OutcomeDeadLettered, consumer.OutcomeStoreError:
		msg := string(obs.Outcome)
		if obs.Err != nil {
			span.RecordError(obs.Err)
			msg = obs.Err.Error()
		}
		span.SetStatus(codes.Error, msg)
	}
}
