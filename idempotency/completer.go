package idempotency

import (
	"context"
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
