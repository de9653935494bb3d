package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/sleep"
)

// completing is an outcome to store before its delivery is acked.
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

// A completion that could not be stored is tried again after
// completeRetryMin, the wait doubling up to completeRetryMax: short enough
// that a result lands soon after a failover ends, long enough that a worker
// holding many results does not flood a store that is coming back.
const (
	completeRetryMin = 100 * time.Millisecond
	completeRetryMax = time.Second
)

// completeOne is complete for one delivery, without allocating; patient
// as completeInto's (a batch handler's run of one, not a single delivery).
func (p *processor) completeOne(ctx context.Context, c completing, patient bool) {
	cs := [1]completing{c}
	var (
		owned [1]bool
		errs  [1]error
		todo  = [1]int{0}
	)
	p.completeInto(ctx, cs[:], owned[:], errs[:], todo[:], patient)
}

// complete stores the outcomes of cs, submitted together so that one store
// call carries a whole run's, then settles each delivery: acked
// once its outcome is stored, redelivered when it could not be, settled as a
// lost claim when another owner holds its key. cs are a batch handler's
// run, whose store call may linger for other runs' to share it
// (Config.CompletionLinger).
func (p *processor) complete(ctx context.Context, cs []completing) {
	todo := make([]int, len(cs))
	for i := range cs {
		todo[i] = i
	}
	p.completeInto(ctx, cs, make([]bool, len(cs)), make([]error, len(cs)), todo, true)
}

// completeInto is complete with its working space: owned and errs of
// len(cs), todo holding every index of cs. patient lets the store call
// linger for others (batcher.do): only when no lane or slot waits for it.
func (p *processor) completeInto(ctx context.Context, cs []completing, owned []bool, errs []error, todo []int, patient bool) {
	// The work is done and its result is held here: the completion is
	// tried until it is stored, or the claim is found lost, or ctx ends (the
	// worker's shutdown deadline, a revoked partition). A delivery given
	// back earlier would be redelivered and, once its lease ran out, run
	// again: a store outage longer than a few tries (a Redis restart, a
	// failover that waits for a replica's resync) would turn every handler
	// that finished in it into a duplicate. While the store is down nothing new can be
	// claimed either; on a Cluster with one primary down, the
	// held deliveries take concurrency slots that keys of the other slots
	// could use, until the primary is back.
	for attempt, wait := 0, completeRetryMin; len(todo) > 0; attempt++ {
		if attempt > 0 {
			if attempt == 1 {
				p.log.Warn("handler finished but its completion could not be stored; holding the result and retrying until the store answers",
					"messages", len(todo), "err", errs[todo[0]])
			}
			if !sleep.For(ctx, wait) {
				break
			}
			wait = min(2*wait, completeRetryMax)
		}
		// The completer reads no values and the delivery's cancellation
		// must not stop it: a deadline shared with the other deliveries.
		if len(todo) == 1 {
			i := todo[0]
			owned[i], errs[i] = p.e.completer.do(p.e.completeBy.Ctx(), cs[i].c, patient)
		} else {
			reqs := make([]Completion, len(todo))
			for j, i := range todo {
				reqs[j] = cs[i].c
			}
			res, rerrs := p.e.completer.doAll(p.e.completeBy.Ctx(), reqs, patient)
			for j, i := range todo {
				owned[i], errs[i] = res[j], rerrs[j]
			}
		}
		// An error that is not the store's unavailability (a request the
		// store refuses as invalid) will not change on retry.
		failed := todo[:0]
		for _, i := range todo {
			if errs[i] != nil && errors.Is(errs[i], ErrStoreUnavailable) {
				failed = append(failed, i)
			}
		}
		todo = failed
	}
	shared := settleCtx{values: ctx} // for the deliveries settled on ctx
	for i, c := range cs {
		d := c.d
		ctx := ctx
		if c.ctx != nil {
			ctx = c.ctx
		}
		switch {
		case errs[i] != nil:
			p.log.Error("handler finished but its completion could not be stored; not acked, the message will be redelivered and run again once its lease ends",
				"origin", d.Message().Origin.String(), "err", errs[i])
			p.settle(ctx, d, consumer.OutcomeStoreError, nak(p.storeRetry.Delay(d.Attempt())))
		case !owned[i]:
			p.log.Warn("claim lost before completion; the new owner finishes the key", "origin", d.Message().Origin.String(), "fence", c.cl.Fence)
			p.settle(ctx, d, consumer.OutcomeLeaseLost, p.afterLoss(ctx, d, c.cl))
		case c.ctx == nil:
			p.settleOn(shared.get(&p.e.settleBy), ctx, d, c.outcome, ack)
		default:
			p.settle(ctx, d, c.outcome, ack)
		}
	}
}
