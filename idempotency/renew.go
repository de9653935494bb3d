package idempotency

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// renew starts r: it renews the lease every third of it (with jitter) and
// heartbeats the transport, until r.stop is called (SPEC §6). When the claim is
// lost, or renewals fail until the lease is about to run out, it cancels the
// handler with ErrLeaseLost.
//
// It is neither a goroutine nor a timer per run: most handlers finish long
// before the first renewal, and a goroutine, two channels and a timer per
// delivery, then a timer and its closures per delivery, were a measurable
// share of the worker's CPU (docs/PERFORMANCE.md). The processor's renewals
// list holds the running handlers, and one timer looks for renewals due.
func (p *processor) renew(r *renewer, hctx context.Context, cancel context.CancelCauseFunc, d consumer.Delivery, cl *Claim, leaseEnd time.Time) {
	r.p, r.hctx, r.cancel, r.d, r.cl, r.leaseEnd = p, hctx, cancel, d, cl, leaseEnd
	p.renewals.add(r, time.Now().Add(jitter(p.cfg.lease/3)))
}

// renewals are the lease renewals of one processor's running handlers: a
// list, and one timer that, while the list is not empty, looks every tick
// for renewals due and runs each on a goroutine of its own. A renewal is
// late by at most a tick (a hundredth of the lease).
type renewals struct {
	tick time.Duration

	mu         sync.Mutex
	head, tail *renewer
	timer      *time.Timer // nil until the first run; armed while head != nil
	armed      bool
}

// renewer is the state of one handler run's lease renewals.
type renewer struct {
	p        *processor
	hctx     context.Context
	cancel   context.CancelCauseFunc
	d        consumer.Delivery
	cl       *Claim
	leaseEnd time.Time // only fire touches it; fires never overlap

	// Guarded by p.renewals.mu:
	prev, next *renewer
	listed     bool      // in the list: not stopped, not over
	due        time.Time // when to renew next
	firing     bool      // a fire is running or about to
	busy       sync.WaitGroup
}

func (s *renewals) add(r *renewer, due time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.due, r.listed = due, true
	r.prev, r.next = s.tail, nil
	if s.tail != nil {
		s.tail.next = r
	} else {
		s.head = r
	}
	s.tail = r
	if s.armed {
		return
	}
	s.armed = true
	if s.timer == nil {
		s.timer = time.AfterFunc(s.tick, s.scan)
	} else {
		s.timer.Reset(s.tick)
	}
}

// unlink takes r off the list; s.mu is held.
func (s *renewals) unlink(r *renewer) {
	if !r.listed {
		return
	}
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		s.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		s.tail = r.prev
	}
	r.prev, r.next, r.listed = nil, nil, false
}

// scan starts the renewals that are due, and arms the timer again while
// handlers run.
func (s *renewals) scan() {
	now := time.Now()
	var due []*renewer
	s.mu.Lock()
	for r := s.head; r != nil; r = r.next {
		if !r.firing && !r.due.After(now) {
			r.firing = true
			r.busy.Add(1)
			due = append(due, r)
		}
	}
	if s.head != nil {
		s.timer.Reset(s.tick)
	} else {
		s.armed = false
	}
	s.mu.Unlock()
	for _, r := range due {
		go r.fire()
	}
}

// stop ends the renewals and waits for one in progress: nothing is renewed,
// heartbeated or cancelled after it returns.
func (r *renewer) stop() {
	s := &r.p.renewals
	s.mu.Lock()
	s.unlink(r)
	s.mu.Unlock()
	r.busy.Wait()
}

// fire renews once, then sets when to renew next unless the renewer was
// stopped, the handler ended or the claim was lost.
func (r *renewer) fire() {
	defer r.busy.Done()
	s := &r.p.renewals
	s.mu.Lock()
	stopped := !r.listed
	s.mu.Unlock()
	var (
		next  time.Duration
		again bool
	)
	if !stopped && r.hctx.Err() == nil {
		next, again = r.once()
	}
	s.mu.Lock()
	r.firing = false
	if again {
		r.due = time.Now().Add(next)
	} else {
		s.unlink(r)
	}
	s.mu.Unlock()
}

// once makes one renewal and heartbeat; it returns when to renew next, or
// false when renewals are over.
func (r *renewer) once() (time.Duration, bool) {
	p, hctx := r.p, r.hctx
	lease := p.cfg.lease
	interval := lease / 3
	start := time.Now()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(hctx), min(lease/3, p.e.timeout))
	_, ok, err := p.e.store.Renew(rctx, r.cl.Key, r.cl.Token, lease)
	rcancel()
	switch {
	case err != nil:
		p.e.hooks.LeaseRenewal(p.name, "error")
		if time.Now().Add(lease / 10).After(r.leaseEnd) {
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

// jitter returns d ±10 %.
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
