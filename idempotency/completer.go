package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// completer coalesces the completions of concurrently finishing handlers
// into batch calls to Store.Complete (SPEC §4.4): one round trip stores many
// results.
//
// It adds no delay: a completion that finds a free flush slot is sent at
// once. While maxFlights batches are in flight, completions queue, and the
// next free flusher takes up to maxBatch of them in one call, so batches grow
// exactly when the store is the bottleneck. Flushers are goroutines that end
// when the queue is empty; Close waits for them.
type completer struct {
	store      Store
	timeout    time.Duration
	maxBatch   int
	maxFlights int

	mu      sync.Mutex
	pending []*completion
	flights int
	wg      sync.WaitGroup
}

type completion struct {
	c    Completion
	ok   bool
	err  error
	done chan struct{}
}

// completerFlights is how many Complete calls may be in flight at once. Two
// keep Redis busy (one batch is answered while the next is sent) and let the
// rest queue into large batches: with four, a completion that found a free
// flight often went alone, and completions cost 0.033-0.045 round trips per
// message instead of 0.019-0.039 (cmd/dedupbench, docs/PERFORMANCE.md).
const completerFlights = 2

func newCompleter(store Store, timeout time.Duration) *completer {
	return &completer{store: store, timeout: timeout, maxBatch: 128, maxFlights: completerFlights}
}

// complete stores c and reports whether the claim was still owned. It
// returns when the batch holding c was answered, or when ctx ends (the
// completion may still be stored then).
func (cp *completer) complete(ctx context.Context, c Completion) (bool, error) {
	req := &completion{c: c, done: make(chan struct{})}
	cp.mu.Lock()
	cp.pending = append(cp.pending, req)
	if cp.flights < cp.maxFlights {
		cp.flights++
		cp.wg.Go(cp.flusher)
	}
	cp.mu.Unlock()
	select {
	case <-req.done:
		return req.ok, req.err
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
}

// flusher sends queued completions in batches until the queue is empty.
func (cp *completer) flusher() {
	for {
		cp.mu.Lock()
		n := min(len(cp.pending), cp.maxBatch)
		if n == 0 {
			cp.flights--
			cp.mu.Unlock()
			return
		}
		batch := cp.pending[:n:n]
		cp.pending = cp.pending[n:]
		if len(cp.pending) == 0 {
			cp.pending = nil // let the backing array go
		}
		cp.mu.Unlock()

		cs := make([]Completion, n)
		for i, r := range batch {
			cs[i] = r.c
		}
		ctx, cancel := context.WithTimeout(context.Background(), cp.timeout)
		ok, err := cp.store.Complete(ctx, cs)
		cancel()
		if err == nil && len(ok) != n {
			err = ErrStoreUnavailable
		}
		for i, r := range batch {
			if err != nil {
				r.err = err
			} else {
				r.ok = ok[i]
			}
			close(r.done)
		}
	}
}

// wait blocks until every flusher has ended.
func (cp *completer) wait() { cp.wg.Wait() }

// claimer coalesces the one-key claims that deliveries make when they run
// (a key not claimed with its batch, a claim gone stale, an in-flight key
// claimed again) into batch calls to Store.Claim, as completer does for
// completions: sent at once while a flight is free, batched while the store
// is busy. A batch never names a key twice: a second request for a key
// waits for the next batch.
type claimer struct {
	store      Store
	timeout    time.Duration
	maxBatch   int
	maxFlights int

	mu      sync.Mutex
	pending []*claimReq
	flights int
	wg      sync.WaitGroup
}

type claimReq struct {
	ctx  context.Context
	r    ClaimRequest
	res  ClaimResult
	err  error
	done chan struct{}
}

func newClaimer(store Store, timeout time.Duration) *claimer {
	return &claimer{store: store, timeout: timeout, maxBatch: 128, maxFlights: completerFlights}
}

// claim claims r alone or with others. It returns when the batch holding r
// was answered, or when ctx ends (r may still be claimed then, and expires
// with its lease: as with a direct call abandoned after it was sent).
func (cl *claimer) claim(ctx context.Context, r ClaimRequest) (ClaimResult, error) {
	req := &claimReq{ctx: ctx, r: r, done: make(chan struct{})}
	cl.mu.Lock()
	cl.pending = append(cl.pending, req)
	if cl.flights < cl.maxFlights {
		cl.flights++
		cl.wg.Go(cl.flusher)
	}
	cl.mu.Unlock()
	select {
	case <-req.done:
		return req.res, req.err
	case <-ctx.Done():
		return ClaimResult{}, context.Cause(ctx)
	}
}

// next takes the next batch off the queue: up to maxBatch requests with
// distinct keys whose callers still wait, in order. Requests whose callers
// left are answered with their context's error and not sent.
func (cl *claimer) next() []*claimReq {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var batch []*claimReq
	var keys map[string]struct{}
	rest := cl.pending[:0]
	for i, req := range cl.pending {
		if len(batch) == cl.maxBatch {
			rest = append(rest, cl.pending[i:]...)
			break
		}
		if err := req.ctx.Err(); err != nil {
			req.err = context.Cause(req.ctx)
			close(req.done)
			continue
		}
		if _, dup := keys[req.r.Key]; dup {
			rest = append(rest, req)
			continue
		}
		if keys == nil {
			keys = make(map[string]struct{})
		}
		keys[req.r.Key] = struct{}{}
		batch = append(batch, req)
	}
	clear(cl.pending[len(rest):])
	cl.pending = rest
	if len(cl.pending) == 0 {
		cl.pending = nil // let the backing array go
	}
	if len(batch) == 0 {
		cl.flights--
	}
	return batch
}

// flusher sends queued claims in batches until the queue is empty.
func (cl *claimer) flusher() {
	for {
		batch := cl.next()
		if len(batch) == 0 {
			return
		}
		reqs := make([]ClaimRequest, len(batch))
		for i, r := range batch {
			reqs[i] = r.r
		}
		ctx, cancel := context.WithTimeout(context.Background(), cl.timeout)
		res, err := cl.store.Claim(ctx, reqs)
		cancel()
		if err == nil && len(res) != len(reqs) {
			err = fmt.Errorf("%w: claim returned %d results for %d keys", ErrStoreUnavailable, len(res), len(reqs))
		}
		for i, r := range batch {
			if err != nil {
				r.err = err
			} else {
				r.res = res[i]
			}
			close(r.done)
		}
	}
}

// wait blocks until every flusher has ended.
func (cl *claimer) wait() { cl.wg.Wait() }
