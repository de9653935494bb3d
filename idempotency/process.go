package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/claimctx"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// maxClaimRounds bounds re-claims after an in-flight key was released.
const maxClaimRounds = 3

// leaseSlack is added to a foreign lease's end before claiming it again, for
// the distance between this clock and the store's.
const leaseSlack = 50 * time.Millisecond

// Process takes one delivery through its claim, its handler and its
// settlement.
func (p *processor) Process(ctx context.Context, d consumer.Delivery) {
	pr := p.take(d)
	if pr == nil {
		pr = p.inspect(d)
	}
	p.process(ctx, d, pr)
}

// process takes d, whose prepared state pr was taken, through its claim,
// its handler and its settlement on its own.
func (p *processor) process(ctx context.Context, d consumer.Delivery, pr *prepared) {
	p.await(pr)
	if ctx.Err() != nil {
		p.abandon(ctx, d, pr)
		return
	}
	if pr.key == "" {
		p.missingKey(ctx, d)
		return
	}
	if o := consumer.ObservationFrom(ctx); o != nil {
		o.KeyHash = keyHash(pr.ekey)
	}
	for round := 0; ; round++ {
		if !pr.claimed || pr.res.Outcome == ClaimInFlight {
			p.adopt(pr)
		}
		if !pr.claimed {
			pr.claimAt = p.e.clock.Now()
			cctx, cancel := context.WithTimeout(ctx, p.e.timeout)
			res, err := p.e.claimer.do(cctx, p.claimRequest(pr), false)
			cancel()
			pr.claimed, pr.err, pr.res = true, err, res
		}
		if pr.err != nil {
			p.storeDown(ctx, d, "claim", pr.err)
			return
		}
		res := pr.res
		switch res.Outcome {
		case ClaimNew, ClaimReclaimed, ClaimRecovered:
			if !p.runOwned(ctx, d, pr) {
				pr.claimed = false // the claim went stale before the run: claim again
				if round < maxClaimRounds {
					continue
				}
				p.inFlight(ctx, d, pr)
			}
			return
		case ClaimDuplicate:
			p.duplicate(ctx, d, res.Record)
			return
		case ClaimMismatch:
			p.mismatch(ctx, d, pr, res.Record)
			return
		case ClaimInFlight:
			switch p.onInFlight(ctx, d, pr, round) {
			case inFlightSettled:
				return
			case inFlightClaimFree:
				round--
			}
		default:
			p.storeDown(ctx, d, "claim", fmt.Errorf("%w: unknown claim outcome %q", ErrStoreUnavailable, res.Outcome))
			return
		}
	}
}

// inFlightNext is what process does after onInFlight.
type inFlightNext int

const (
	inFlightSettled   inFlightNext = iota // d is settled
	inFlightClaim                         // claim again, in the next round
	inFlightClaimFree                     // claim again, within this round
)

// onInFlight acts on a claim of round that found pr's key in flight
// elsewhere: claim again at once after a batch claim, run it unclaimed in
// shadow mode, wait for the owner, or redeliver it later once
// the rounds are used up or the owner still holds it after the wait.
func (p *processor) onInFlight(ctx context.Context, d consumer.Delivery, pr *prepared, round int) inFlightNext {
	if pr.batched && !p.cfg.shadow {
		// The batch claim found the key in flight, perhaps long ago:
		// claim again before waiting, which costs one round trip where
		// the wait's read and the claim after it cost two. Not a round of
		// its own.
		pr.claimed, pr.batched = false, false
		return inFlightClaimFree
	}
	if p.cfg.shadow {
		p.runUnclaimed(ctx, d, pr.key, consumer.OutcomeWouldSkip)
		return inFlightSettled
	}
	if round >= maxClaimRounds {
		p.inFlight(ctx, d, pr)
		return inFlightSettled
	}
	rec, err := p.waitInFlight(ctx, d, pr.ekey, pr.res.Record)
	switch {
	case ctx.Err() != nil:
		p.abandon(ctx, d, &prepared{})
		return inFlightSettled
	case err != nil:
		p.storeDown(ctx, d, "inflight", err)
		return inFlightSettled
	case rec != nil:
		p.inFlight(ctx, d, pr)
		return inFlightSettled
	}
	pr.claimed = false // completed, released or gone: the claim decides
	return inFlightClaim
}

// waitInFlight waits up to the in-flight wait for the owner of key to
// finish. It returns nil when the key should be claimed again
// (completed, released, gone, or its owner's lease ran out: a crashed worker
// is reclaimed as soon as its lease ends, not after the whole wait), or the
// record still in flight when the wait is over.
//
// While it waits it heartbeats d every third of the lease (with jitter),
// the cadence of a running handler's renewals: a wait can be as long as the
// lease, and NATS redelivers a message not heartbeated within AckWait
// (which defaults to the lease).
func (p *processor) waitInFlight(ctx context.Context, d consumer.Delivery, key string, rec *Record) (*Record, error) {
	deadline := time.Now().Add(p.cfg.inFlightWait)
	beatEvery := p.cfg.lease / 3
	nextBeat := time.Now().Add(jitter(beatEvery))
	for {
		wait := time.Until(deadline)
		if rec != nil && !rec.LeaseUntil.IsZero() {
			// LeaseUntil is on the store's clock: it only shortens the
			// wait; the claim script decides.
			wait = min(wait, time.Until(rec.LeaseUntil)+leaseSlack)
		}
		if wait <= 0 {
			if time.Now().Before(deadline) {
				return nil, nil // the lease ran out: claim now
			}
			return rec, nil
		}
		if beatEvery > 0 {
			if !time.Now().Before(nextBeat) {
				p.heartbeat(ctx, d)
				nextBeat = time.Now().Add(jitter(beatEvery))
			}
			wait = min(wait, time.Until(nextBeat))
		}
		wctx, cancel := context.WithTimeout(ctx, wait+p.e.timeout)
		got, err := p.e.store.Wait(wctx, key, wait)
		cancel()
		if err != nil {
			return nil, err
		}
		if got == nil || got.State != StateClaimed || got.Released {
			return nil, nil
		}
		rec = got // still claimed: renewed (wait on) or expired (claim)
	}
}

// runOwned runs the handler under an owned claim. It returns false, having
// done nothing, when a claim prepared earlier turned out to be lost before
// the handler started.
func (p *processor) runOwned(ctx context.Context, d consumer.Delivery, pr *prepared) bool {
	leaseEnd, st := p.ready(ctx, d, pr)
	switch st {
	case claimLost:
		return false
	case claimSettled:
		return true
	}
	run, hctx := p.start(ctx, d, pr, leaseEnd)
	start := time.Now()
	p.e.handlerStarted()
	result, herr := dispatch.CallHandler(hctx, p.h, d.Message())
	p.e.handlerReturned()
	took := time.Since(start)
	run.renewer.stop()
	if c, ok := p.outcome(ctx, d, pr, run, hctx, result, herr, took, true); ok {
		p.completeOne(ctx, c, false)
	}
	run.cancel(nil)
	return true
}

// readiness is what ready found of an owned claim.
type readiness int

const (
	claimReady   readiness = iota // run the handler
	claimLost                     // the claim went stale: claim again
	claimSettled                  // the delivery was settled without running
)

// ready checks an owned claim before its handler runs: it refreshes a claim
// that waited (for a concurrency slot, or behind earlier messages of its
// partition), and dead-letters a key that used up its runs. It returns the
// claim's lease end.
func (p *processor) ready(ctx context.Context, d consumer.Delivery, pr *prepared) (time.Time, readiness) {
	res := pr.res
	cl := res.Claim
	leaseEnd := pr.claimAt.Add(p.cfg.lease)
	if now := p.e.clock.Now(); now.Sub(pr.claimAt) > p.cfg.lease/3 {
		start := now
		rctx, cancel := context.WithTimeout(ctx, p.e.timeout)
		_, ok, err := p.e.store.Renew(rctx, cl.Key, cl.Token, p.cfg.lease)
		cancel()
		if err != nil {
			p.storeDown(ctx, d, "renew", err)
			return leaseEnd, claimSettled
		}
		if !ok {
			return leaseEnd, claimLost
		}
		leaseEnd = start.Add(p.cfg.lease)
	}
	if res.Outcome == ClaimRecovered {
		p.e.hooks.CorruptRecord(p.name)
		p.log.Warn("stored value was not a valid record; replaced by a fresh claim", "key_hash", keyHash(pr.ekey))
	}
	if cl.Attempts > p.retry.MaxAttempts {
		// The key has had its max_attempts runs, and the last of them
		// ended with no outcome stored (its worker died, or it lost its
		// lease): an error would have dead-lettered it. The attempts are
		// counted in the record, across restarts, so a
		// key that kills its worker on every run stops here instead of
		// running for ever.
		runs := cl.Attempts - 1
		err := fmt.Errorf("dedup: the key had %d runs (max_attempts %d) and the last ended without an outcome: its worker stopped or lost the lease during it", runs, p.retry.MaxAttempts)
		if c, ok := p.deadLetterOwned(ctx, d, cl, pr.key, dispatch.ReasonMaxAttempts, err, runs); ok {
			p.completeOne(ctx, c, false)
		}
		return leaseEnd, claimSettled
	}
	return leaseEnd, claimReady
}

// start prepares one handler run under pr's owned claim: the context that
// carries the claim (FromContext, Step) and ends when the claim is lost, and
// the lease renewals, which run until run.renewer.stop. The caller cancels
// the context with run.cancel once the run's outcome is settled.
func (p *processor) start(ctx context.Context, d consumer.Delivery, pr *prepared, leaseEnd time.Time) (*handlerRun, context.Context) {
	run := &handlerRun{}
	return run, p.startIn(run, ctx, d, pr, leaseEnd)
}

// startIn is start in the zero handlerRun run, for a batch that allocates
// its runs together.
func (p *processor) startIn(run *handlerRun, ctx context.Context, d consumer.Delivery, pr *prepared, leaseEnd time.Time) context.Context {
	cl := pr.res.Claim
	run.Bind(ctx)
	run.Val = runState{
		info: claimctx.Info{
			Handler: p.name, Key: pr.key, EffectiveKey: cl.Key, Fence: cl.Fence,
			Attempt: max(cl.Attempts, 1), Reclaimed: pr.res.Outcome == ClaimReclaimed,
		},
		store: p.e.store,
		token: cl.Token,
		steps: cl.Steps,
	}
	hctx, cancel := context.WithCancelCause(run)
	run.cancel = cancel
	p.renew(&run.renewer, hctx, cancel, d, cl, leaseEnd)
	return hctx
}

// outcome decides the fate of d after its handler ran under run's claim
// and returned result and herr: a success or a dead-letter
// returns the completion still to be stored and true (the caller stores it,
// with those of the rest of its run, and settles it in complete); a lost
// claim, a cancellation or a retry is settled here and returns false.
// observe says whether ctx's Observation belongs to d alone.
func (p *processor) outcome(ctx context.Context, d consumer.Delivery, pr *prepared, run *handlerRun, hctx context.Context, result []byte, herr error, took time.Duration, observe bool) (completing, bool) {
	cl := pr.res.Claim
	m := d.Message()
	rs := &run.Val
	p.e.hooks.HandlerDone(p.name, took, herr)
	if o := consumer.ObservationFrom(ctx); o != nil && observe {
		o.Fence, o.Attempt, o.Err = cl.Fence, rs.info.Attempt, herr
	}

	if errors.Is(context.Cause(hctx), ErrLeaseLost) {
		p.log.Warn("claim lost while the handler ran; its result is discarded and the new owner finishes the key",
			"origin", m.Origin.String(), "fence", cl.Fence, "took", took)
		p.settle(ctx, d, consumer.OutcomeLeaseLost, p.afterLoss(ctx, d, cl))
		return completing{}, false
	}
	attempt := rs.info.Attempt
	f := dispatch.Decide(ctx, herr, attempt, p.retry)
	switch f.Action {
	case dispatch.ActAck:
		outcome := consumer.OutcomeProcessed
		if pr.res.Outcome == ClaimReclaimed {
			outcome = consumer.OutcomeReclaimed
		}
		return p.completion(d, cl, RecordOutcomeOK, result, nil, outcome), true
	case dispatch.ActRedeliver:
		p.log.Info("handler cancelled; claim released for redelivery", "origin", m.Origin.String(), "cause", context.Cause(ctx))
		p.release(ctx, cl)
		p.settle(ctx, d, consumer.OutcomeCancelled, nak(0))
		return completing{}, false
	}
	var pe *consumer.PanicError
	if errors.As(herr, &pe) {
		p.log.Error("handler panicked", "origin", m.Origin.String(), "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
	}
	if f.Action == dispatch.ActDeadLetter {
		return p.deadLetterOwned(ctx, d, cl, pr.key, f.Reason, herr, attempt)
	}
	p.log.Warn("handler failed; released for retry", "origin", m.Origin.String(), "attempt", attempt,
		"max_attempts", p.retry.MaxAttempts, "delay", f.Delay, "err", herr)
	p.release(ctx, cl)
	p.settle(ctx, d, consumer.OutcomeFailed, nak(f.Delay))
	return completing{}, false
}

// runUnclaimed runs the handler without a claim (passthrough, fail-open,
// shadow duplicates): ack on success, retry or dead-letter on failure.
func (p *processor) runUnclaimed(ctx context.Context, d consumer.Delivery, key string, outcome consumer.Outcome) {
	m := d.Message()
	// The handler's context ends when it returns (the Runner may share the
	// delivery's context between deliveries).
	hctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	_, herr := dispatch.CallHandler(hctx, p.h, m)
	cancel()
	p.e.hooks.HandlerDone(p.name, time.Since(start), herr)
	switch f := dispatch.Decide(ctx, herr, d.Attempt(), p.retry); f.Action {
	case dispatch.ActAck:
		p.settle(ctx, d, outcome, ack)
	case dispatch.ActRedeliver:
		p.settle(ctx, d, consumer.OutcomeCancelled, nak(0))
	case dispatch.ActDeadLetter:
		dl := consumer.DeadLetter{Reason: f.Reason, Err: herr.Error(), Key: key, Handler: p.name, Attempts: d.Attempt()}
		if !p.publishDeadLetter(ctx, d, dl) {
			p.retryDeadLetter(ctx, d, d.Attempt())
			return
		}
		p.settle(ctx, d, consumer.OutcomeDeadLettered, ack)
	case dispatch.ActRetry:
		p.log.Warn("handler failed; will retry", "origin", m.Origin.String(), "attempt", d.Attempt(), "delay", f.Delay, "err", herr)
		p.settle(ctx, d, consumer.OutcomeFailed, nak(f.Delay))
	}
}
