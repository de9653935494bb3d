package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// batcher coalesces single store calls made by concurrently running
// deliveries into batch calls (SPEC §4.4): one round trip answers many.
// The engine has two: one for Complete, one for the one-key claims that
// deliveries make when they run (a key not claimed with its batch, a claim
// gone stale, an in-flight key claimed again).
//
// It adds no delay: a request that finds a free flight is sent at once.
// While maxFlights batches are in flight, requests queue, and the next free
// flusher takes up to maxBatch of them in one call, so batches grow exactly
// when the store is the bottleneck. A batch never names a key twice (a
// second request for a key waits for the next batch: stores refuse duplicate
// keys in one call). Requests whose callers left are answered with their
// context's error and not sent. Flushers are goroutines that end when the
// queue is empty; wait blocks until they have.
type batcher[Req, Res any] struct {
	op         string
	timeout    time.Duration
	maxBatch   int
	maxFlights int
	key        func(Req) string
	send       func(ctx context.Context, reqs []Req) ([]Res, error)

	mu      sync.Mutex
	pending []*batchReq[Req, Res]
	flights int
	keys    map[string]struct{} // next's, emptied at each call: a batch's keys
	wg      sync.WaitGroup

	// free holds requests whose caller took the answer, for reuse: a
	// request and its channel per completion were a tenth of the worker's
	// allocated bytes (a memory profile of cmd/dedupbench).
	free sync.Pool
}

// batchReq is one caller's request. It is answered exactly once, by a send
// on done (buffered, so the sender never waits); a caller that left before
// the answer never touches it again, and it is not reused.
type batchReq[Req, Res any] struct {
	ctx  context.Context
	req  Req
	res  Res
	err  error
	done chan struct{}
}

// batchFlights is how many batch calls of one kind may be in flight at once.
// Two keep Redis busy (one batch is answered while the next is sent) and let
// the rest queue into large batches: with four, a completion that found a
// free flight often went alone, and completions cost 0.033-0.045 round trips
// per message instead of 0.019-0.039 (cmd/dedupbench).
const batchFlights = 2

// batchMax bounds one batch call.
const batchMax = 128

func newBatcher[Req, Res any](op string, timeout time.Duration, key func(Req) string, send func(context.Context, []Req) ([]Res, error)) *batcher[Req, Res] {
	return &batcher[Req, Res]{op: op, timeout: timeout, maxBatch: batchMax, maxFlights: batchFlights, key: key, send: send}
}

// newCompleter batches Store.Complete.
func newCompleter(store Store, timeout time.Duration) *batcher[Completion, bool] {
	return newBatcher("complete", timeout, func(c Completion) string { return c.Key }, store.Complete)
}

// newClaimer batches Store.Claim.
func newClaimer(store Store, timeout time.Duration) *batcher[ClaimRequest, ClaimResult] {
	return newBatcher("claim", timeout, func(r ClaimRequest) string { return r.Key }, store.Claim)
}

// do sends req alone or with others. It returns when the batch holding req
// was answered, or when ctx ends (req may still be applied then: as with a
// direct call abandoned after it was sent).
func (b *batcher[Req, Res]) do(ctx context.Context, req Req) (Res, error) {
	r, _ := b.free.Get().(*batchReq[Req, Res])
	if r == nil {
		r = &batchReq[Req, Res]{done: make(chan struct{}, 1)}
	}
	r.ctx, r.req = ctx, req
	b.mu.Lock()
	b.pending = append(b.pending, r)
	if b.flights < b.maxFlights {
		b.flights++
		b.wg.Go(b.flusher)
	}
	b.mu.Unlock()
	select {
	case <-r.done:
		res, err := r.res, r.err
		*r = batchReq[Req, Res]{done: r.done} // hold no caller's values while pooled
		b.free.Put(r)
		return res, err
	case <-ctx.Done():
		var zero Res
		return zero, context.Cause(ctx)
	}
}

// doAll sends reqs together: queued at once, in order, they go in the same
// batch call unless the queue already holds more than maxBatch requests or
// reqs name a key twice. It returns each request's answer, as do would,
// when all were answered or ctx ended (the unanswered then get its cause).
func (b *batcher[Req, Res]) doAll(ctx context.Context, reqs []Req) ([]Res, []error) {
	rs := make([]*batchReq[Req, Res], len(reqs))
	for i, req := range reqs {
		r, _ := b.free.Get().(*batchReq[Req, Res])
		if r == nil {
			r = &batchReq[Req, Res]{done: make(chan struct{}, 1)}
		}
		r.ctx, r.req = ctx, req
		rs[i] = r
	}
	b.mu.Lock()
	b.pending = append(b.pending, rs...)
	if b.flights < b.maxFlights {
		b.flights++
		b.wg.Go(b.flusher)
	}
	b.mu.Unlock()
	res := make([]Res, len(reqs))
	errs := make([]error, len(reqs))
	// Flushers answer a batch's requests in queue order, so the last is
	// waited for first: once it is answered the earlier ones mostly are,
	// and are taken without parking again.
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		select {
		case <-r.done:
			res[i], errs[i] = r.res, r.err
			*r = batchReq[Req, Res]{done: r.done}
			b.free.Put(r)
		case <-ctx.Done():
			// The rest are answered with ctx's cause; their requests are
			// not reused (a flusher may still answer them).
			for j := i; j >= 0; j-- {
				errs[j] = context.Cause(ctx)
			}
			return res, errs
		}
	}
	return res, errs
}

// next takes the next batch off the queue: up to maxBatch requests with
// distinct keys whose callers still wait, in order.
func (b *batcher[Req, Res]) next() []*batchReq[Req, Res] {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pending) == 0 {
		b.pending = nil // let the backing array go
		b.flights--
		return nil
	}
	batch := make([]*batchReq[Req, Res], 0, min(len(b.pending), b.maxBatch))
	// One map for every batch, reused under mu: a batch's keys are needed
	// only while next runs.
	if b.keys == nil {
		b.keys = make(map[string]struct{}, b.maxBatch)
	}
	keys := b.keys
	defer clear(keys)
	rest := b.pending[:0]
	for i, r := range b.pending {
		if len(batch) == b.maxBatch {
			rest = append(rest, b.pending[i:]...)
			break
		}
		if r.ctx.Err() != nil {
			r.err = context.Cause(r.ctx)
			r.done <- struct{}{}
			continue
		}
		k := b.key(r.req)
		if _, dup := keys[k]; dup {
			rest = append(rest, r)
			continue
		}
		keys[k] = struct{}{}
		batch = append(batch, r)
	}
	clear(b.pending[len(rest):])
	b.pending = rest
	if len(b.pending) == 0 {
		b.pending = nil // let the backing array go
	}
	if len(batch) == 0 {
		b.flights--
	}
	return batch
}

// flusher sends queued requests in batches until the queue is empty.
func (b *batcher[Req, Res]) flusher() {
	for {
		batch := b.next()
		if len(batch) == 0 {
			return
		}
		reqs := make([]Req, len(batch))
		for i, r := range batch {
			reqs[i] = r.req
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		res, err := b.send(ctx, reqs)
		cancel()
		if err == nil && len(res) != len(reqs) {
			err = fmt.Errorf("%w: %s returned %d results for %d keys", ErrStoreUnavailable, b.op, len(res), len(reqs))
		}
		for i, r := range batch {
			if err != nil {
				r.err = err
			} else {
				r.res = res[i]
			}
			r.done <- struct{}{}
		}
	}
}

// wait blocks until every flusher has ended.
func (b *batcher[Req, Res]) wait() { b.wg.Wait() }
