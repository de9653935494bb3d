package consumer

import (
	"context"
)

// Result is a batch handler's outcome for one message: what Handler.Handle
// returns, as a value. Value is stored with the completed record; Err
// chooses the message's fate exactly as a Handle error does (Permanent,
// RetryAfter, or a plain error for the backoff).
type Result struct {
	Value []byte
	Err   error
}

// BatchHandler does the work for a run of messages at once, for example one
// produce call for all of them. A Handler that also implements BatchHandler
// is given runs where the source has them (Kafka: consecutive messages of a
// partition, or of a key under key ordering; NATS: the owned part of a
// fetch); Handle is still used for a message that runs alone (a retry, a
// message whose key was in flight elsewhere).
//
// results has len(msgs) and is zeroed: the handler fills results[i] for
// msgs[i]. Each message then completes, retries or is dead-lettered on its
// own, from its Result alone: a failure of one message does not fail the
// others. msgs are in delivery order; under Kafka ordering the handler must
// keep that order in its side effects (one produce call does).
//
// ctx is the run's context: it ends when the worker stops past its drain
// timeout or the Kafka partition is revoked. Each message also has a context
// of its own, MessageContext(ctx, i), which carries that message's claim
// (dedupworker.ClaimOf, dedupworker.Step) and ends when that claim's
// lease is lost; a handler that cannot tell the messages' contexts apart
// uses ctx. A panic in HandleBatch becomes a *PanicError for every message
// of the call.
type BatchHandler interface {
	HandleBatch(ctx context.Context, msgs []*Message, results []Result)
}

// BatchFunc adapts a function to a Handler that is also a BatchHandler:
// HandleBatch calls f, and Handle calls f on a batch of one.
type BatchFunc func(ctx context.Context, msgs []*Message, results []Result)

// HandleBatch calls f(ctx, msgs, results).
func (f BatchFunc) HandleBatch(ctx context.Context, msgs []*Message, results []Result) {
	f(ctx, msgs, results)
}

// Handle runs f on a batch of one message. ctx is also that message's
// context (MessageContext(ctx, 0) is ctx).
func (f BatchFunc) Handle(ctx context.Context, m *Message) ([]byte, error) {
	msgs := [1]*Message{m}
	var res [1]Result
	f(ctx, msgs[:], res[:])
	return res[0].Value, res[0].Err
}

// A RunHandledNotifier is a delivery of a source that keeps an order
// (Kafka's offset order) and can start the next run of that order sooner
// when it learns that a run's handlers are done. The source hands such a
// delivery first in the run it passes to Runner.ProcessBatch.
//
// A Processor that supports it calls the run's first delivery's RunHandled,
// when that delivery is a RunHandledNotifier, at most once during
// ProcessBatch: when the handler
// has returned for every delivery of the run with a result to store, and
// nothing of the call is left to run a handler, so that no delivery of the
// run is to be retried for its handler's failure or run again by this call.
// What remains is storing the results and settling the deliveries, which
// ProcessBatch still does before it returns.
//
// Once notified, the source may start the handler of the next run of the
// same order while this call stores its results: every side effect of this
// run happened before it. A delivery that the call settles with a Nak after
// the notice (its result could not be stored because the store lost its
// claim and record) is retried after what the source started since; its
// handler's first run was in order. A processor that never notifies loses
// nothing: the source then waits for ProcessBatch to return.
type RunHandledNotifier interface {
	// RunHandled returns promptly and does not call into the processor.
	RunHandled()
}

type deliveryCtxKey struct{}

// WithDeliveryContexts returns ctx carrying a context for each delivery of
// a run, for a wrapper around a Processor's ProcessBatch that gives each
// delivery values of its own (a trace span, an Observation): the processor runs,
// settles and observes delivery d on DeliveryContext(ctx, d). Each context
// must be derived from ctx, so that the run's cancellation reaches it.
func WithDeliveryContexts(ctx context.Context, ctxs map[Delivery]context.Context) context.Context {
	return context.WithValue(ctx, deliveryCtxKey{}, ctxs)
}

// DeliveryContext returns the context WithDeliveryContexts gave d, or ctx.
func DeliveryContext(ctx context.Context, d Delivery) context.Context {
	if m, ok := ctx.Value(deliveryCtxKey{}).(map[Delivery]context.Context); ok {
		if c, ok := m[d]; ok {
			return c
		}
	}
	return ctx
}
