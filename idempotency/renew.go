package idempotency

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// renew starts r: it renews the lease every third of it (with jitter) and
// heartbeats the transport, until r.stop is called. When the claim is
// lost, or renewals fail until the lease is about to run out, it cancels the
// handler with ErrLeaseLost. The processor's schedule runs it.
func (p *processor) renew(r *renewer, hctx context.Context, cancel context.CancelCauseFunc, d consumer.Delivery, cl *Claim, leaseEnd time.Time) {
	r.p, r.hctx, r.cancel, r.d, r.cl, r.leaseEnd = p, hctx, cancel, d, cl, leaseEnd
	p.renewals.add(&r.entry, r, p.e.clock.Now().Add(jitter(p.cfg.lease/3)))
}

// renewer is the state of one handler run's lease renewals.
type renewer struct {
	entry    // its place in p.renewals
	p        *processor
	hctx     context.Context
	cancel   context.CancelCauseFunc
	d        consumer.Delivery
	cl       *Claim
	leaseEnd time.Time // only renew touches it; renewals never overlap
}

// stop ends the renewals and waits for one in progress: nothing is renewed,
// heartbeated or cancelled after it returns.
func (r *renewer) stop() { r.p.renewals.stop(&r.entry) }

// renew is the renewJob of a handler run: none once the handler's context
// ended.
func (r *renewer) renew() (time.Duration, bool) {
	if r.hctx.Err() != nil {
		return 0, false
	}
	return r.once()
}

// once makes one renewal and heartbeat; it returns when to renew next, or
// false when renewals are over.
func (r *renewer) once() (time.Duration, bool) {
	p, hctx := r.p, r.hctx
	lease := p.cfg.lease
	interval := lease / 3
	start := p.e.clock.Now()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(hctx), min(lease/3, p.e.timeout))
	_, ok, err := p.e.store.Renew(rctx, r.cl.Key, r.cl.Token, lease)
	rcancel()
	switch {
	case err != nil:
		p.e.hooks.LeaseRenewal(p.name, "error")
		if p.e.clock.Now().Add(lease / 10).After(r.leaseEnd) {
			p.log.Error("lease renewals failed until the lease ran out; cancelling the handler", "err", err)
			r.cancel(ErrLeaseLost)
			return 0, false
		}
		p.log.Warn("lease renewal failed; retrying", "err", err)
		return jitter(max(interval/4, 10*time.Millisecond)), true
	case !ok:
		p.e.hooks.LeaseRenewal(p.name, "lost")
		r.cancel(ErrLeaseLost)
		return 0, false
	}
	p.e.hooks.LeaseRenewal(p.name, "ok")
	r.leaseEnd = start.Add(lease)
	p.heartbeat(hctx, r.d)
	return jitter(interval), true
}

// jitter returns d moved by up to a tenth either way.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/10 + time.Duration(rand.Int64N(int64(d)/5+1))
}

// heartbeat tells the transport that d is still being worked on, within a
// third of the lease or the store timeout; a failure is logged, not
// returned: the next heartbeat may succeed, and a redelivery is a duplicate
// the claim catches.
func (p *processor) heartbeat(ctx context.Context, d consumer.Delivery) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(p.cfg.lease/3, p.e.timeout))
	defer cancel()
	if err := d.Heartbeat(hctx); err != nil {
		p.log.Warn("transport heartbeat failed", "err", err)
	}
}
