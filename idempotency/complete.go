package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// completing is an outcome to store before its delivery is acked
// (SPEC §5.2).
type completing struct {
	d       consumer.Delivery
	cl      *Claim
	c       Completion
	outcome consumer.Outcome
	// ctx is the delivery's own context in a run whose deliveries have
	// one each (consumer.DeliveryContext), nil otherwise: it is settled,
	// and its outcome observed, on it.
	ctx context.Context
}

func (p *processor) completion(d consumer.Delivery, cl *Claim, recOutcome string, result []byte, meta map[string]string, outcome consumer.Outcome) completing {
	return completing{
		d: d, cl: cl, outcome: outcome,
		c: Completion{Key: cl.Key, Token: cl.Token, Outcome: recOutcome, Result: result, Meta: meta, Retention: p.cfg.retention},
	}
}

// completeAttempts is how many times complete tries to store a completion.
const completeAttempts = 3

// completeOne is complete for one delivery, without allocating.
func (p *processor) completeOne(ctx context.Context, c completing) {
	cs := [1]completing{c}
	var (
		owned [1]bool
		errs  [1]error
		todo  = [1]int{0}
	)
	p.completeInto(ctx, cs[:], owned[:], errs[:], todo[:])
}

// complete stores the outcomes of cs, submitted together so that one store
// call carries a whole run's (SPEC §4.4), then settles each delivery: acked
// once its outcome is stored, redelivered when it could not be, settled as a
// lost claim when another owner holds its key.
func (p *processor) complete(ctx context.Context, cs []completing) {
	todo := make([]int, len(cs))
	for i := range cs {
		todo[i] = i
	}
	p.completeInto(ctx, cs, make([]bool, len(cs)), make([]error, len(cs)), todo)
}

// completeInto is complete with its working space: owned and errs of
// len(cs), todo holding every index of cs.
func (p *processor) completeInto(ctx context.Context, cs []completing, owned []bool, errs []error, todo []int) {
	// The work is done: try hard to record it before giving up, since a
	// redelivery would run it again once the lease expires.
	for attempt, wait := 0, 100*time.Millisecond; len(todo) > 0 && attempt < completeAttempts; attempt, wait = attempt+1, wait*3 {
		if attempt > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		// The completer reads no values and the delivery's cancellation
		// must not stop it: a deadline shared with the other deliveries.
		if len(todo) == 1 {
			i := todo[0]
			owned[i], errs[i] = p.e.completer.do(p.e.completeBy.Ctx(), cs[i].c)
		} else {
			reqs := make([]Completion, len(todo))
			for j, i := range todo {
				reqs[j] = cs[i].c
			}
			res, rerrs := p.e.completer.doAll(p.e.completeBy.Ctx(), reqs)
			for j, i := range todo {
				owned[i], errs[i] = res[j], rerrs[j]
			}
		}
		failed := todo[:0]
		for _, i := range todo {
			if errs[i] != nil {
				failed = append(failed, i)
			}
		}
		todo = failed
	}
	var acks context.Context // settleCtx(ctx), made for the first ack on ctx
	for i, c := range cs {
		d := c.d
		ctx := ctx
		if c.ctx != nil {
			ctx = c.ctx
		}
		switch {
		case errs[i] != nil:
			p.log.Error("handler finished but its completion could not be stored; not acked, the message will be redelivered",
				"origin", d.Message().Origin.String(), "err", errs[i])
			p.settle(ctx, d, consumer.OutcomeStoreError, nak(p.storeRetry.Delay(d.Attempt())))
		case !owned[i]:
			p.log.Warn("claim lost before completion; the new owner finishes the key", "origin", d.Message().Origin.String(), "fence", c.cl.Fence)
			p.settle(ctx, d, consumer.OutcomeLeaseLost, p.afterLoss(ctx, d, c.cl))
		case c.ctx != nil:
			p.settle(ctx, d, c.outcome, ack)
		default:
			// The acks of a run follow each other at once: one settle
			// context serves them all.
			if acks == nil {
				acks = p.settleCtx(ctx)
			}
			p.settleOn(acks, ctx, d, c.outcome, ack)
		}
	}
}
