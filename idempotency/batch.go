package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// ownedRun is one delivery of a run whose claim is owned and ready.
type ownedRun struct {
	d        consumer.Delivery
	pr       *prepared
	leaseEnd time.Time
	// ctx is the delivery's context: consumer.DeliveryContext of the
	// run's, which is the run's own unless a wrapper gave it one.
	ctx context.Context
}

// ProcessBatch takes a contiguous run of deliveries through SPEC §5–§7,
// handing a consumer.BatchHandler the deliveries it owns in one call
// (SPEC §11.4). A handler that is not a BatchHandler, and shadow mode,
// which runs every delivery, get them one at a time.
//
// In order, each delivery of ds is:
//   - owned (claimed NEW, RECLAIMED or RECOVERED by Prepare, and still
//     held): added to the pending batch;
//   - a duplicate or a fingerprint mismatch: answered at once, as Process
//     answers it; the handler never sees it;
//   - anything else (in flight elsewhere, not claimed yet, a claim gone
//     stale, a failed claim, a missing key): a cut. The pending batch runs
//     first, then this delivery alone, exactly as Process runs it (waiting
//     for the key's owner, claiming again), then the rest. Order is kept:
//     no message runs before one ahead of it whose fate it could depend on.
//
// After a HandleBatch call every message completes, retries or is
// dead-lettered on its own from its Result; the completions of the call are
// submitted to the store together, then the deliveries are settled.
func (p *processor) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	bh, ok := p.h.(consumer.BatchHandler)
	if !ok || p.cfg.shadow {
		for _, d := range ds {
			p.Process(ctx, d)
		}
		return
	}
	run := make([]ownedRun, 0, len(ds))
	flush := func() {
		p.runBatch(ctx, bh, run)
		run = run[:0]
	}
	for _, d := range ds {
		pr := p.take(d)
		if pr == nil {
			pr = p.inspect(d)
		}
		dctx := consumer.DeliveryContext(ctx, d)
		if dctx != ctx && pr.key != "" {
			if o := consumer.ObservationFrom(dctx); o != nil {
				o.KeyHash = keyHash(pr.ekey)
			}
		}
		if ctx.Err() != nil {
			for _, o := range run {
				p.abandon(o.ctx, o.d, o.pr)
			}
			run = run[:0]
			p.abandon(dctx, d, pr)
			continue
		}
		if pr.key == "" || !pr.claimed || pr.err != nil {
			flush()
			p.process(dctx, d, pr)
			continue
		}
		switch pr.res.Outcome {
		case ClaimNew, ClaimReclaimed, ClaimRecovered:
			leaseEnd, st := p.ready(dctx, d, pr)
			switch st {
			case claimReady:
				run = append(run, ownedRun{d: d, pr: pr, leaseEnd: leaseEnd, ctx: dctx})
			case claimLost:
				flush()
				pr.claimed, pr.batched = false, false
				p.process(dctx, d, pr)
			}
		case ClaimDuplicate:
			p.duplicate(dctx, d, pr.res.Record)
		case ClaimMismatch:
			p.mismatch(dctx, d, pr, pr.res.Record)
		default:
			flush()
			p.process(dctx, d, pr)
		}
	}
	flush()
}

// Batching reports whether ProcessBatch hands runs to the handler: it is a
// consumer.BatchHandler and the engine is not in shadow mode.
func (p *processor) Batching() bool {
	_, ok := p.h.(consumer.BatchHandler)
	return ok && !p.cfg.shadow
}

// runBatch runs the handler on the owned deliveries of run in one call,
// with the lease of every claim renewed while it runs, then stores their
// completions together and settles them. A run of one goes through Handle.
func (p *processor) runBatch(ctx context.Context, bh consumer.BatchHandler, run []ownedRun) {
	switch len(run) {
	case 0:
		return
	case 1:
		o := run[0]
		r, hctx := p.start(o.ctx, o.d, o.pr, o.leaseEnd)
		start := time.Now()
		result, herr := consumer.CallHandler(hctx, p.h, o.d.Message())
		took := time.Since(start)
		r.renewer.stop()
		if c, ok := p.outcome(o.ctx, o.d, o.pr, r, hctx, result, herr, took, true); ok {
			p.completeOne(o.ctx, c)
		}
		r.cancel(nil)
		return
	}
	runs := make([]handlerRun, len(run))
	hctxs := make([]context.Context, len(run))
	msgs := make([]*consumer.Message, len(run))
	for i, o := range run {
		hctxs[i] = p.startIn(&runs[i], o.ctx, o.d, o.pr, o.leaseEnd)
		msgs[i] = o.d.Message()
	}
	results := make([]consumer.Result, len(run))
	bctx, cancel := context.WithCancel(consumer.WithMessageContexts(ctx, hctxs))
	start := time.Now()
	consumer.CallBatchHandler(bctx, bh, msgs, results)
	took := time.Since(start)
	cancel()
	for i := range runs {
		runs[i].renewer.stop()
	}
	cs := make([]completing, 0, len(run))
	for i, o := range run {
		// A delivery with a context of its own has an Observation of its
		// own; the run's is shared by all of them.
		own := o.ctx != ctx
		if c, ok := p.outcome(o.ctx, o.d, o.pr, &runs[i], hctxs[i], results[i].Value, results[i].Err, took, own); ok {
			if own {
				c.ctx = o.ctx
			}
			cs = append(cs, c)
		}
	}
	if len(cs) > 0 {
		p.complete(ctx, cs)
	}
	for i := range runs {
		runs[i].cancel(nil)
	}
}
