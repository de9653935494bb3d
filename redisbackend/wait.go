package redisbackend

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
)

// Wait waits up to max for key to settle. It returns the record
// once COMPLETED; nil once the key is released, gone or not a record (claim
// again); the record still CLAIMED when max has passed. It subscribes before
// its first read, so a completion between the two is not missed, and re-reads
// after PollFloor, doubling to PollCap, whether or not a notification comes.
// A done ctx ends it with ctx's error.
//
// With Options.LocalCache, a Wait on a key this Store holds a live claim on
// waits in process for that claim to end, without Redis: it returns the
// COMPLETED record once this Store completed it into the cache, or the
// CLAIMED record when max passes first; when the claim ends otherwise
// (released, lost, its lease passing, the cache's trust lost), the wait
// goes on with Redis for what is left of max.
func (s *Store) Wait(ctx context.Context, key string, max time.Duration) (*idempotency.Record, error) {
	const op = "wait" // errors name the method; the engine times it as op "inflight"
	if err := s.live(op); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(max)
	rkey := s.prefix + key
	if s.cache != nil {
		if rec, settled, err := s.waitLocal(ctx, op, rkey, deadline); settled {
			return rec, err
		}
		max = time.Until(deadline)
	}
	wake, ready, stopped := s.notify.watch(rkey)
	defer s.notify.unwatch(rkey, wake)

	timer := time.NewTimer(min(max, s.cap))
	defer timer.Stop()
	if max > 0 {
		// Subscribe, then read. The subscription is normally confirmed in a
		// round trip; should it not be, the re-reads below still find the
		// outcome, only later.
		select {
		case <-ready:
		case <-timer.C:
		case <-ctx.Done():
			return nil, waitCtxErr(ctx)
		case <-stopped:
			return nil, storeErr(op, ErrClosed)
		}
	}
	poll := s.floor
	for {
		rec, err := s.get(ctx, op, key)
		if err != nil {
			if ctx.Err() != nil {
				return nil, waitCtxErr(ctx)
			}
			return nil, err
		}
		if rec == nil || rec.Released {
			return nil, nil
		}
		if rec.State == idempotency.StateCompleted {
			return rec, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return rec, nil
		}
		timer.Reset(min(poll, left))
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			return nil, waitCtxErr(ctx)
		case <-stopped:
			return nil, storeErr(op, ErrClosed)
		}
		poll = min(2*poll, s.cap)
	}
}

// waitLocal is the part of a Wait on rkey that the local cache answers
// (see Wait): it returns settled false, having waited at most until
// deadline, once nothing local can be relied on, and Redis must be asked.
func (s *Store) waitLocal(ctx context.Context, op, rkey string, deadline time.Time) (rec *idempotency.Record, settled bool, err error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		now := time.Now()
		w, ok := s.cache.await(rkey, now)
		switch {
		case !ok:
			return nil, false, nil
		case w.completed != nil:
			s.cache.localWaits.Add(1)
			return w.completed, true, nil
		case !now.Before(deadline):
			s.cache.localWaits.Add(1)
			return w.claim, true, nil
		}
		d := min(deadline.Sub(now), w.until.Sub(now))
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-w.ended: // completed, released, lost: look again
		case <-timer.C: // max, or the claim's local answers, ran out
		case <-ctx.Done():
			return nil, true, waitCtxErr(ctx)
		case <-s.notify.stop:
			return nil, true, storeErr(op, ErrClosed)
		}
	}
}

// waitCtxErr is the error of a Wait whose context ended while it slept: the
// context's, not the store's.
func waitCtxErr(ctx context.Context) error {
	return &ctxError{err: context.Cause(ctx)}
}

type ctxError struct{ err error }

func (e *ctxError) Error() string { return "dedup: redis wait: " + e.err.Error() }
func (e *ctxError) Unwrap() error { return e.err }

// subscriberHealth is how long the subscriber connection may be silent
// before it is pinged; a ping unanswered for as long again means the
// connection is dead and is replaced.
const subscriberHealth = 5 * time.Second

// notifierIdle is how long the subscriber stays subscribed without waiters.
// Waits are rare (only for keys in flight), and every completion is
// published to every subscribed process: a worker that waited once should
// not go on receiving them all for good.
const notifierIdle = 30 * time.Second

// errIdle ends receive when the notifier had no waiters for its idle period.
var errIdle = errors.New("no waiters")

// notifier is a Store's single Pub/Sub connection, fanning the
// keys published on the channel out to the waiters of each key. It starts
// with the first watch, resubscribes when the connection fails, and stops
// once it has had no waiters for idle, or at close; the next watch starts it
// again.
//
// Starting and stopping are decided under mu: watch starts a run unless one
// is started; a run stops only when, under mu, there are no waiters and have
// been none for idle, and then clears started, so a watch either registers
// before that decision (and the run keeps going) or starts a new run.
type notifier struct {
	client  redis.UniversalClient
	channel string
	log     *slog.Logger
	idle    time.Duration // notifierIdle; positive; tests shorten it before the first watch

	ctx    context.Context // ends at close: unblocks dials and reads
	cancel context.CancelFunc
	stop   chan struct{}  // closed by close
	runs   sync.WaitGroup // the run goroutines started; close waits for them

	mu          sync.Mutex
	waiters     map[string]map[chan struct{}]struct{}
	emptySince  time.Time // when waiters last became empty; zero while there are some
	started     bool      // a run goroutine is running and has not decided to stop
	closed      bool
	done        chan struct{} // closed when the latest run returns (closed before any)
	ready       chan struct{} // closed while subscribed; replaced when that ends
	readyClosed bool
	ps          *redis.PubSub
}

func newNotifier(client redis.UniversalClient, channel string, log *slog.Logger) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	close(done)
	return &notifier{
		client:  client,
		channel: channel,
		log:     log,
		idle:    notifierIdle,
		ctx:     ctx,
		cancel:  cancel,
		stop:    make(chan struct{}),
		done:    done,
		waiters: make(map[string]map[chan struct{}]struct{}),
		ready:   make(chan struct{}),
	}
}

// watch registers a waiter for rkey, starting the subscriber if it is not
// running. wake receives (without blocking the subscriber) when rkey is
// published; ready is closed once the subscription is confirmed; stopped is
// closed by close.
func (n *notifier) watch(rkey string) (wake chan struct{}, ready, stopped <-chan struct{}) {
	wake = make(chan struct{}, 1)
	n.mu.Lock()
	defer n.mu.Unlock()
	set := n.waiters[rkey]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		n.waiters[rkey] = set
	}
	set[wake] = struct{}{}
	n.emptySince = time.Time{}
	if !n.started && !n.closed {
		n.started = true
		n.done = make(chan struct{})
		n.runs.Add(1) // before closed is set, so before close's Wait
		go n.run(n.done)
	}
	return wake, n.ready, n.stop
}

func (n *notifier) unwatch(rkey string, wake chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	set := n.waiters[rkey]
	delete(set, wake)
	if len(set) == 0 {
		delete(n.waiters, rkey)
		if len(n.waiters) == 0 {
			n.emptySince = time.Now()
		}
	}
}

// dispatch wakes the waiters of the keys in payload; it reports whether the
// run should stop for want of waiters (see idleStopLocked).
//
// A payload is one key (release.lua, a completion of one key),
// or the keys of one completion call, "\n" key "\n" key ... "\n"
// (lua/complete.lua). A key may itself hold a newline, so a batch payload is
// not split: each waited key is looked for, delimited, in it, which finds
// every key published and, at worst, wakes a waiter whose key was not (it
// re-reads and waits again). Waiters are few, so this is a handful of
// searches per message.
func (n *notifier) dispatch(payload string) (stop bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	batch := strings.HasPrefix(payload, "\n")
	for rkey, set := range n.waiters {
		if rkey != payload && !(batch && containsDelimited(payload, rkey)) {
			continue
		}
		for wake := range set {
			select {
			case wake <- struct{}{}:
			default: // already woken, not yet read
			}
		}
	}
	return n.idleStopLocked()
}

// containsDelimited reports whether payload holds "\n" key "\n".
func containsDelimited(payload, key string) bool {
	for i := 0; ; {
		j := strings.Index(payload[i:], key)
		if j < 0 {
			return false
		}
		at := i + j
		if at > 0 && payload[at-1] == '\n' && at+len(key) < len(payload) && payload[at+len(key)] == '\n' {
			return true
		}
		i = at + 1
	}
}

// idleStop reports whether the run should stop for want of waiters.
func (n *notifier) idleStop() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.idleStopLocked()
}

// idleStopLocked decides, with n.mu held, whether the run stops: when there
// have been no waiters for n.idle. If so the notifier is left as before the
// first watch (not started, not ready, no PubSub), so the next watch starts
// a new run; the caller closes its PubSub and returns without touching the
// notifier again.
func (n *notifier) idleStopLocked() bool {
	if len(n.waiters) > 0 || n.emptySince.IsZero() || time.Since(n.emptySince) < n.idle {
		return false
	}
	n.started = false
	n.ps = nil
	if n.readyClosed {
		n.ready = make(chan struct{})
		n.readyClosed = false
	}
	return true
}

func (n *notifier) setReady(ready bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case ready && !n.readyClosed:
		close(n.ready)
		n.readyClosed = true
	case !ready && n.readyClosed:
		n.ready = make(chan struct{})
		n.readyClosed = false
	}
}

// close stops the subscriber and waits for every run it started.
func (n *notifier) close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	ps := n.ps
	close(n.stop)
	n.cancel()
	n.mu.Unlock()
	if ps != nil {
		_ = ps.Close() // unblocks a read in progress
	}
	n.runs.Wait()
}

// run keeps one subscription alive until close, or until it has had no
// waiters for n.idle. done is closed when it returns.
func (n *notifier) run(done chan struct{}) {
	defer n.runs.Done()
	defer close(done)
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	for {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return
		}
		if n.idleStopLocked() { // all waiters left before, or while backing off
			n.mu.Unlock()
			n.logIdle()
			return
		}
		n.mu.Unlock()

		ps := n.client.Subscribe(n.ctx, n.channel)
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			_ = ps.Close()
			return
		}
		n.ps = ps
		n.mu.Unlock()

		subscribed, err := n.receive(ps)
		if errors.Is(err, errIdle) {
			// idleStopLocked has reset the notifier; a new run may be
			// subscribing already.
			_ = ps.Close()
			n.logIdle()
			return
		}
		n.setReady(false)
		n.mu.Lock()
		n.ps = nil
		closed := n.closed
		n.mu.Unlock()
		_ = ps.Close()
		if closed {
			return
		}
		if subscribed {
			backoff = minBackoff
		}
		n.log.Warn("dedup: redis subscriber lost its connection; waiters poll until it is back",
			"channel", n.channel, "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-n.stop:
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (n *notifier) logIdle() {
	n.log.Debug("dedup: redis subscriber unsubscribed: no waiters", "channel", n.channel, "idle", n.idle)
}

// receive reads from ps until the connection fails, close, or the notifier
// has had no waiters for n.idle (errIdle); it reports whether the
// subscription was confirmed first.
func (n *notifier) receive(ps *redis.PubSub) (subscribed bool, err error) {
	// Wake at least every tick to notice idleness on a silent channel; on a
	// busy one each message checks. Health is by the clock: a ping after
	// subscriberHealth of silence, dead after as long again unanswered.
	tick := min(subscriberHealth, n.idle)
	heard := time.Now()
	var pinged time.Time
	for {
		msg, err := ps.ReceiveTimeout(n.ctx, tick)
		if err != nil {
			if n.ctx.Err() != nil {
				return subscribed, n.ctx.Err()
			}
			if !isTimeout(err) {
				return subscribed, err
			}
			if n.idleStop() {
				return subscribed, errIdle
			}
			switch {
			case pinged.IsZero():
				if time.Since(heard) >= subscriberHealth {
					// Silent for a while: prove the connection still answers.
					if err := ps.Ping(n.ctx); err != nil {
						return subscribed, err
					}
					pinged = time.Now()
				}
			case time.Since(pinged) >= subscriberHealth:
				return subscribed, err // the ping went unanswered
			}
			continue
		}
		heard, pinged = time.Now(), time.Time{}
		stop := false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == n.channel {
				subscribed = true
				n.setReady(true)
			}
			stop = n.idleStop()
		case *redis.Message:
			stop = n.dispatch(m.Payload)
		default:
			stop = n.idleStop()
		}
		if stop {
			return subscribed, errIdle
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
