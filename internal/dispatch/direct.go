package dispatch

import (
	"context"
	"errors"
	"github.com/idemkit/dedupworker/consumer"
	"log/slog"
	"time"
)

// direct is the Processor used without WithProcessor: at-least-once, no
// deduplication.
type direct struct {
	name  string
	h     consumer.Handler
	hooks consumer.Hooks
	log   *slog.Logger
	retry RetryPolicy // Config.Retry
}

// settleTimeout bounds an ack or nak issued after the processing context may
// already be cancelled.
const settleTimeout = 10 * time.Second

// Prepare does nothing: direct keeps no state across a fetched batch.
func (p *direct) Prepare(context.Context, []consumer.Delivery) {}

func (p *direct) Process(ctx context.Context, d consumer.Delivery) {
	m := d.Message()
	tr := m.Origin.Transport
	if ctx.Err() != nil {
		p.settle(ctx, func(c context.Context) error { return d.Nak(c, 0) })
		p.outcome(ctx, tr, consumer.OutcomeCancelled)
		return
	}
	start := time.Now()
	_, err := callHandler(ctx, p.h, m)
	p.hooks.HandlerDone(p.name, time.Since(start), err)
	p.fate(ctx, d, err)
}

// ProcessBatch hands a BatchHandler the run in one call, then settles each
// delivery from its own result; a plain Handler gets one call a delivery.
func (p *direct) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	bh, ok := p.h.(consumer.BatchHandler)
	if !ok || len(ds) < 2 || ctx.Err() != nil {
		for _, d := range ds {
			p.Process(ctx, d)
		}
		return
	}
	msgs := make([]*consumer.Message, len(ds))
	for i, d := range ds {
		msgs[i] = d.Message()
	}
	results := make([]consumer.Result, len(ds))
	hctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	CallBatchHandler(hctx, bh, msgs, results)
	took := time.Since(start)
	cancel()
	for i, d := range ds {
		p.hooks.HandlerDone(p.name, took, results[i].Err)
		p.fate(ctx, d, results[i].Err)
	}
}

// Batching reports whether the handler is a BatchHandler.
func (p *direct) Batching() bool {
	_, ok := p.h.(consumer.BatchHandler)
	return ok
}

// fate settles d after its handler returned err, as Decide says under the
// worker's RetryPolicy.
func (p *direct) fate(ctx context.Context, d consumer.Delivery, err error) {
	m := d.Message()
	tr := m.Origin.Transport
	f := Decide(ctx, err, d.Attempt(), p.retry)
	switch f.Action {
	case ActAck:
		p.settle(ctx, d.Ack)
		p.outcome(ctx, tr, consumer.OutcomeProcessed)
	case ActRedeliver:
		p.settle(ctx, func(c context.Context) error { return d.Nak(c, 0) })
		p.outcome(ctx, tr, consumer.OutcomeCancelled)
	case ActDeadLetter:
		dlErr := p.deadLetter(ctx, d, consumer.DeadLetter{Reason: f.Reason, Err: err.Error(), Handler: p.name, Attempts: d.Attempt()})
		if dlErr != nil && !errors.Is(dlErr, consumer.ErrNoDeadLetter) {
			p.log.Error("dead-letter publish failed; will retry", "handler", p.name, "origin", m.Origin.String(), "err", dlErr)
			p.settle(ctx, func(c context.Context) error { return d.Nak(c, p.retry.Delay(d.Attempt())) })
			p.outcome(ctx, tr, consumer.OutcomeFailed)
			return
		}
		if dlErr != nil {
			p.log.Error("message to dead-letter but no dead-letter destination: message dropped", "handler", p.name, "origin", m.Origin.String(), "reason", f.Reason, "err", err)
		}
		p.settle(ctx, d.Ack)
		p.outcome(ctx, tr, consumer.OutcomeDeadLettered)
	case ActRetry:
		p.log.Warn("handler failed; will retry", "handler", p.name, "origin", m.Origin.String(), "attempt", d.Attempt(), "delay", f.Delay, "err", err)
		p.settle(ctx, func(c context.Context) error { return d.Nak(c, f.Delay) })
		p.outcome(ctx, tr, consumer.OutcomeFailed)
	}
}

// deadLetter publishes dl with the settle deadline: it may run after ctx
// was cancelled.
func (p *direct) deadLetter(ctx context.Context, d consumer.Delivery, dl consumer.DeadLetter) error {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	return d.DeadLetter(c, dl)
}

func (p *direct) settle(ctx context.Context, f func(context.Context) error) {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := f(c); err != nil {
		p.log.Error("settling delivery failed; the broker will redeliver", "handler", p.name, "err", err)
	}
}

func (p *direct) outcome(ctx context.Context, transport string, o consumer.Outcome) {
	p.hooks.Outcome(p.name, transport, o)
	if obs := consumer.ObservationFrom(ctx); obs != nil {
		obs.Outcome = o
	}
}

// callHandler runs h with a context that ends when it returns, as the
// handler's context always did (the Runner may share one context between
// deliveries).
func callHandler(ctx context.Context, h consumer.Handler, m *consumer.Message) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return CallHandler(ctx, h, m)
}
