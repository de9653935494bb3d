package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
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

// ProcessBatch takes a contiguous run of deliveries through the claim, the
// handler and the settlement, handing a consumer.BatchHandler the
// deliveries it owns in one call. A handler that is not a BatchHandler, and shadow mode,
// which runs every delivery, get them one at a time.
//
// In order, each delivery of ds is:
//   - not claimed by Prepare (its key came earlier in the same fetch), or
//     found in flight by Prepare's claim (the key's owner may have finished
//     since): claimed again now, as Process claims (a held claim of the key
//     is adopted, else one claim call), then taken as below. When a
//     delivery of the pending batch owns its key, it is held back instead:
//     its fate is that delivery's, so it is processed, alone and as Process
//     processes it, once the batch has run and settled, before anything
//     after it. It is then a duplicate when the batch completed the key;
//     when that delivery failed and released the key, it runs after the
//     batch, as that delivery's retry would. Producer retries and
//     redeliveries land next to their original, so neither of these cuts
//     the batch;
//   - owned (claimed NEW, RECLAIMED or RECOVERED, and still held): added to
//     the pending batch;
//   - a duplicate or a fingerprint mismatch: answered at once, as Process
//     answers it; the handler never sees it;
//   - anything else (in flight elsewhere, a claim gone stale, a failed
//     claim, a missing key): a cut. The pending batch runs first (and what
//     it held back), then this delivery alone, exactly as Process runs it
//     (waiting for the key's owner, claiming again), then the rest. Order
//     is kept: no message runs before one ahead of it whose fate it could
//     depend on.
//
// After a HandleBatch call every message completes, retries or is
// dead-lettered on its own from its Result; the completions of the call are
// submitted to the store together, then the deliveries are settled.
func (p *processor) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	// A plain handler's run of one takes the path of a batch handler's: the
	// same steps as Process, and its source learns when the handler is done
	// (consumer.RunHandledNotifier), so that a Kafka lane starts its next delivery
	// while this one's result is stored. bh is used only for runs of two or
	// more.
	bh, ok := p.h.(consumer.BatchHandler)
	if p.cfg.shadow || !ok && len(ds) != 1 {
		for _, d := range ds {
			p.Process(ctx, d)
		}
		return
	}
	run := make([]ownedRun, 0, len(ds))
	// behind holds, in order, the deliveries of keys that a delivery of run
	// owns.
	var behind []heldBack
	// flush runs the pending batch, then what it held back. The last flush
	// of the call notifies the source once the batch's handlers are done
	// (consumer.RunHandledNotifier) when nothing was held back behind it: nothing
	// of the call is then left to run.
	flush := func(last bool) {
		var handled []consumer.Delivery
		if last && len(behind) == 0 {
			handled = ds
		}
		p.runBatch(ctx, bh, run, handled)
		run = run[:0]
		for i, b := range behind {
			p.process(b.ctx, b.d, b.pr)
			behind[i] = heldBack{}
		}
		behind = behind[:0]
	}
	for _, d := range ds {
		pr := p.take(d)
		if pr == nil {
			pr = p.inspect(d)
		}
		dctx := consumer.DeliveryContext(ctx, d)
		p.await(pr)
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
			for _, b := range behind {
				p.abandon(b.ctx, b.d, b.pr)
			}
			behind = behind[:0]
			p.abandon(dctx, d, pr)
			continue
		}
		if pr.key != "" && pr.err == nil && (!pr.claimed || pr.batched && pr.res.Outcome == ClaimInFlight) {
			if owns(run, pr.ekey) {
				behind = append(behind, heldBack{d: d, pr: pr, ctx: dctx})
				continue
			}
			p.claimNow(dctx, pr)
		}
		if pr.key == "" || !pr.claimed || pr.err != nil {
			flush(false)
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
				flush(false)
				pr.claimed, pr.batched = false, false
				p.process(dctx, d, pr)
			}
		case ClaimDuplicate:
			p.duplicate(dctx, d, pr.res.Record)
		case ClaimMismatch:
			p.mismatch(dctx, d, pr, pr.res.Record)
		default:
			flush(false)
			p.process(dctx, d, pr)
		}
	}
	flush(true)
}

// heldBack is a delivery of ProcessBatch whose key a delivery of the pending
// batch owns.
type heldBack struct {
	d   consumer.Delivery
	pr  *prepared
	ctx context.Context
}

// owns reports whether a delivery of run holds the claim of ekey.
func owns(run []ownedRun, ekey string) bool {
	for i := range run {
		if run[i].pr.ekey == ekey {
			return true
		}
	}
	return false
}

// claimNow claims pr's key for a delivery of a batch that Prepare did not
// claim it for, or whose batch claim found it in flight, as the first round
// of process claims: a held claim of the key, made for a delivery that has
// not started, is adopted; otherwise one claim call decides.
func (p *processor) claimNow(ctx context.Context, pr *prepared) {
	pr.claimed, pr.batched = false, false
	if p.adopt(pr) {
		return
	}
	pr.claimAt = p.e.clock.Now()
	cctx, cancel := context.WithTimeout(ctx, p.e.timeout)
	res, err := p.e.claimer.do(cctx, p.claimRequest(pr), false)
	cancel()
	pr.claimed, pr.err, pr.res = true, err, res
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
// When every delivery of run has a result to store, runBatch notifies the
// source of handled, a non-empty run of ProcessBatch, that its handlers are
// done before it stores them (consumer.RunHandledNotifier).
func (p *processor) runBatch(ctx context.Context, bh consumer.BatchHandler, run []ownedRun, handled []consumer.Delivery) {
	switch len(run) {
	case 0:
		return
	case 1:
		o := run[0]
		r, hctx := p.start(o.ctx, o.d, o.pr, o.leaseEnd)
		start := time.Now()
		p.e.handlerStarted()
		result, herr := dispatch.CallHandler(hctx, p.h, o.d.Message())
		p.e.handlerReturned()
		took := time.Since(start)
		r.renewer.stop()
		if c, ok := p.outcome(o.ctx, o.d, o.pr, r, hctx, result, herr, took, true); ok {
			dispatch.RunHandled(handled)
			p.completeOne(o.ctx, c, true)
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
	bctx, cancel := context.WithCancel(dispatch.WithMessageContexts(ctx, hctxs))
	start := time.Now()
	p.e.handlerStarted()
	dispatch.CallBatchHandler(bctx, bh, msgs, results)
	p.e.handlerReturned()
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
	if len(cs) == len(run) {
		dispatch.RunHandled(handled)
	}
	if len(cs) > 0 {
		p.complete(ctx, cs)
	}
	for i := range runs {
		runs[i].cancel(nil)
	}
}
