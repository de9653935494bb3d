package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/ctxshare"
)

// settleTimeout bounds an ack, nak or dead-letter publish.
const settleTimeout = 10 * time.Second

type settleFunc func(ctx context.Context, d consumer.Delivery) error

// settle acks or naks with its own deadline (it must work during shutdown,
// when ctx is cancelled) and reports the outcome.
func (p *processor) settle(ctx context.Context, d consumer.Delivery, outcome consumer.Outcome, f settleFunc) {
	// The delivery's values (its trace span) on a deadline shared with
	// the other settles.
	p.settleOn(ctxshare.WithValues(p.e.settleBy.Ctx(), ctx), ctx, d, outcome, f)
}

// settleOn is settle with the context to settle on, sctx: ctx's values on
// a deadline of settleBy's.
func (p *processor) settleOn(sctx, ctx context.Context, d consumer.Delivery, outcome consumer.Outcome, f settleFunc) {
	if err := f(sctx, d); err != nil {
		p.log.Error("settling the delivery failed; the broker will redeliver it", "origin", d.Message().Origin.String(), "outcome", string(outcome), "err", err)
	}
	p.e.hooks.Outcome(p.name, d.Message().Origin.Transport, outcome)
	if o := consumer.ObservationFrom(ctx); o != nil {
		o.Outcome = outcome
	}
}

// settleCtx makes settle's contexts for the deliveries of a run settled
// on one context, values: the context made for the last of them is reused
// while settleBy hands out the same deadline, which is what settle would
// make again.
type settleCtx struct {
	values   context.Context
	deadline context.Context
	ctx      context.Context
}

// get returns WithValues(settleBy.Ctx(), s.values).
func (s *settleCtx) get(settleBy *ctxshare.Deadlines) context.Context {
	if dl := settleBy.Ctx(); s.ctx == nil || dl != s.deadline {
		s.deadline, s.ctx = dl, ctxshare.WithValues(dl, s.values)
	}
	return s.ctx
}

func ack(ctx context.Context, d consumer.Delivery) error { return d.Ack(ctx) }

func nak(delay time.Duration) settleFunc {
	return func(ctx context.Context, d consumer.Delivery) error { return d.Nak(ctx, delay) }
}

// afterLoss settles a delivery whose claim was lost: acked when the record
// shows a new owner (claimed under another token) or a completion, who
// finishes the key; otherwise redelivered after the store
// backoff. A record that is gone (Redis restarted without its data), or a
// store that cannot say, has no new owner: acking would lose the message.
func (p *processor) afterLoss(ctx context.Context, d consumer.Delivery, cl *Claim) settleFunc {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.e.timeout)
	rec, err := p.e.store.Get(gctx, cl.Key)
	cancel()
	if err == nil && rec != nil && (rec.State == StateCompleted || rec.Token != cl.Token && !rec.Released) {
		return ack
	}
	p.log.Warn("no new owner holds the key of a lost claim; redelivering", "origin", d.Message().Origin.String(), "fence", cl.Fence, "err", err)
	return nak(p.storeRetry.Delay(d.Attempt()))
}

func (p *processor) release(ctx context.Context, cl *Claim) {
	keep := min(p.cfg.retention, 2*p.cfg.backoffMax+p.cfg.lease)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.e.timeout)
	defer cancel()
	if _, err := p.e.store.Release(rctx, cl.Key, cl.Token, keep); err != nil {
		p.log.Warn("releasing claim failed; it frees itself when its lease expires", "lease", p.cfg.lease, "err", err)
	}
}

// abandon settles a delivery that will not run because ctx is cancelled:
// release a claim made for it and ask for redelivery at once.
func (p *processor) abandon(ctx context.Context, d consumer.Delivery, pr *prepared) {
	if pr.claimed && pr.err == nil && pr.res.Outcome.Owned() {
		p.release(ctx, pr.res.Claim)
	}
	p.settle(ctx, d, consumer.OutcomeCancelled, nak(0))
}

func (p *processor) duplicate(ctx context.Context, d consumer.Delivery, rec *Record) {
	if p.cfg.shadow {
		p.runUnclaimed(ctx, d, "", consumer.OutcomeWouldSkip)
		return
	}
	if p.cfg.onDuplicate != nil && rec != nil {
		hctx, cancel := context.WithTimeout(ctx, settleTimeout)
		err := p.cfg.onDuplicate(hctx, d, rec)
		cancel()
		if err != nil {
			p.log.Warn("OnDuplicate hook failed", "origin", d.Message().Origin.String(), "err", err)
		}
	}
	p.settle(ctx, d, consumer.OutcomeDuplicate, ack)
}

func (p *processor) mismatch(ctx context.Context, d consumer.Delivery, pr *prepared, rec *Record) {
	if p.cfg.mismatch == MismatchIgnore {
		p.duplicate(ctx, d, rec)
		return
	}
	if p.cfg.shadow {
		p.runUnclaimed(ctx, d, pr.key, consumer.OutcomeWouldSkip)
		return
	}
	p.log.Warn("idempotency key reused for different content; rejected", "origin", d.Message().Origin.String(), "key_hash", keyHash(pr.ekey))
	dl := consumer.DeadLetter{Reason: "fingerprint_mismatch", Err: "payload fingerprint differs from the stored record's", Key: pr.key, Handler: p.name}
	if !p.publishDeadLetter(ctx, d, dl) {
		p.retryDeadLetter(ctx, d, d.Attempt())
		return
	}
	p.settle(ctx, d, consumer.OutcomeMismatch, ack)
}

func (p *processor) missingKey(ctx context.Context, d consumer.Delivery) {
	if p.cfg.missingKey == MissingKeyPassthrough {
		p.runUnclaimed(ctx, d, "", consumer.OutcomePassthrough)
		return
	}
	dl := consumer.DeadLetter{Reason: "missing_key", Err: "no idempotency key from " + sourcesString(p.cfg.keySources), Handler: p.name}
	if !p.publishDeadLetter(ctx, d, dl) {
		p.retryDeadLetter(ctx, d, d.Attempt())
		return
	}
	p.settle(ctx, d, consumer.OutcomeMissingKey, ack)
}

func (p *processor) inFlight(ctx context.Context, d consumer.Delivery, pr *prepared) {
	delay := p.inFlightRetry.Delay(d.Attempt())
	p.log.Info("key in flight elsewhere; redelivering later", "origin", d.Message().Origin.String(), "key_hash", keyHash(pr.ekey), "delay", delay)
	p.settle(ctx, d, consumer.OutcomeInFlight, nak(delay))
}

// storeDown handles an unavailable store: fail-closed by default.
func (p *processor) storeDown(ctx context.Context, d consumer.Delivery, op string, err error) {
	if ctx.Err() != nil {
		p.abandon(ctx, d, &prepared{})
		return
	}
	if p.cfg.failOpen {
		p.log.Warn("store unavailable; running without deduplication (fail_open)", "op", op, "err", err)
		p.runUnclaimed(ctx, d, "", consumer.OutcomeStoreBypassed)
		return
	}
	delay := p.storeRetry.Delay(d.Attempt())
	p.log.Warn("store unavailable; not running, not acking, retrying", "op", op, "delay", delay, "err", err)
	p.settle(ctx, d, consumer.OutcomeStoreError, nak(delay))
}
