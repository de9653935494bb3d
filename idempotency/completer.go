package idempotency

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// batcher coalesces single store calls made by concurrently running
// deliveries into batch calls: one round trip answers many.
// The engine has two: one for Complete, one for the one-key claims that
// deliveries make when they run (a key not claimed with its batch, a claim
// gone stale, an in-flight key claimed again).
//
// Without a linger it adds no delay: a request that finds a free flight is
// sent at once. While maxFlights batches are in flight, requests queue, and
// the next free flusher takes up to maxBatch of them in one call, so batches
// grow exactly when the store is the bottleneck. With a linger, a flusher
// about to send fewer than lingerFull requests, all patient, first waits
// until the oldest has waited linger, lingerFull are queued, an impatient
// one is, or idle reports that no more are coming: at a steady rate of a
// message or two a run, calls then carry several requests instead of one
// each (see Config.CompletionLinger). A batch never names a key twice (a
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
	// linger is how long a short batch waits for more requests (0: none).
	linger time.Duration
	// idle reports that no more requests are coming soon, which ends a
	// linger (nil: never); nudge is called when it may have turned true.
	idle func() bool
	// full wakes the lingering flusher to check again (nudge).
	full chan struct{}

	mu      sync.Mutex
	pending []*batchReq[Req, Res]
	// since is when the queue's oldest request was queued, as far as a
	// linger needs it: when it last went from empty to not, or, after a
	// batch left requests behind, when that batch was taken.
	since     time.Time
	lingering bool // a flusher waits in linger: it will take what is queued
	// urgent counts the queued requests that are not patient: while there
	// is one, nothing lingers.
	urgent int
	// closing is set by wait: nothing lingers any more.
	closing bool
	flights int
	keys    map[string]struct{} // next's, emptied at each call: a batch's keys
	wg      sync.WaitGroup

	// route, when set, names the node of a request's key (a store's
	// NodeRouter): the requests of each node other than "" queue, fly and
	// are answered in that node's own batcher in nodes, so that a node
	// that hangs until the call's deadline holds back only its own keys,
	// and the others' results reach their callers when their node answers.
	route func(ctx context.Context, key string) string
	// nodes maps a node to its batcher: written rarely (a node's batcher
	// is made once and kept), read by every nudge, so a copy-on-write map
	// that readers load without a lock; nodesMu orders the writers.
	nodesMu sync.Mutex
	nodes   atomic.Pointer[map[string]*batcher[Req, Res]]
	// trouble, when set, limits the route to the nodes in trouble: the
	// requests of the others go together in this batcher's batches, each
	// sent as a call a node (sendByNode).
	trouble *nodeTrouble
	self    string // the node of a node's own batcher, "" for the parent
	// hedge: a request may be sent again while its first call is out, so
	// a batch over several nodes goes in one call, and apart only when
	// that call is slow (sendHedged); else apart at once (sendByNode).
	hedge bool

	// free holds requests whose answer was taken, for reuse: a request
	// and its channel per completion were a tenth of the worker's
	// allocated bytes (a memory profile of the bench module's dedupbench),
	// and a request per key of a Prepare on a Cluster (doEach) 160 of its
	// 4 600 bytes a message (redisbackend's BenchmarkClusterEngine).
	free sync.Pool
}

// batchReq is one caller's request. It is answered exactly once: by a send
// on done (buffered, so the sender never waits), after which its caller
// puts it back in the batcher's free pool once it took the answer (a
// caller that left before the answer never touches it again, and it is
// not reused); or by a call of then, after which the batcher puts it back.
type batchReq[Req, Res any] struct {
	ctx  context.Context
	req  Req
	res  Res
	err  error
	done chan struct{}
	// patient: nothing waits on the answer but the caller itself, so the
	// request may linger (see do).
	patient bool
	// then, when set, takes the answer instead of done, with idx
	// (doEach).
	then func(idx int, res Res, err error)
	idx  int
}

// answer hands r its answer: on done, or to then, after which nothing
// refers to r (its caller does not wait on done), and it goes back to
// b.free.
func (b *batcher[Req, Res]) answer(r *batchReq[Req, Res]) {
	if r.then == nil {
		r.done <- struct{}{}
		return
	}
	r.then(r.idx, r.res, r.err)
	*r = batchReq[Req, Res]{done: r.done}
	b.free.Put(r)
}

// batchFlights is how many batch calls of one kind may be in flight at once.
// Two keep Redis busy (one batch is answered while the next is sent) and let
// the rest queue into large batches: with four, a completion that found a
// free flight often went alone, and completions cost 0.033-0.045 round trips
// per message instead of 0.019-0.039 (the bench module's dedupbench).
const batchFlights = 2

// nodeFlights is how many batch calls of one kind a node's batcher (a
// store's NodeRouter) has in flight at once. One: the nodes' calls are in
// flight together, so each node is kept busy by its own, and its next
// batch grows while its call is out. Two a node cost more round trips a
// message than one batcher over all nodes, for no more throughput
// (redisbackend's BenchmarkClusterEngine, trips/msg).
const nodeFlights = 1

// batchMax bounds one batch call.
const batchMax = 128

// lingerFull is how many queued requests a linger does not wait beyond: a
// backlog's runs fill a call at once, and only a trickle waits for company.
const lingerFull = batchMax / 4

func newBatcher[Req, Res any](op string, timeout time.Duration, key func(Req) string, send func(context.Context, []Req) ([]Res, error)) *batcher[Req, Res] {
	return &batcher[Req, Res]{
		op: op, timeout: timeout, maxBatch: batchMax, maxFlights: batchFlights, key: key, send: send,
		full: make(chan struct{}, 1),
	}
}

// newCompleter batches Store.Complete, a short batch waiting up to linger.
// On a store with a NodeRouter the completions of all healthy nodes are
// taken in one batch and sent in one call, and again as a call a node only
// when that call is slow (sendHedged): a completion repeated by its token
// changes nothing. The completions of nodes in trouble go to batchers of
// their own (nodeTrouble): a batcher per node would cost a healthy cluster
// a quarter more CPU a message than one batcher over all of them
// (redisbackend's BenchmarkClusterEngine).
func newCompleter(store Store, timeout, linger time.Duration) *batcher[Completion, bool] {
	b := newBatcher("complete", timeout, func(c Completion) string { return c.Key }, store.Complete)
	b.linger = linger
	b.routeBy(store)
	b.hedge = true
	return b
}

// nodeTrouble is the set of nodes whose last call failed: a key's error
// that is a NodeError puts its node in, and a call of that node's own
// batcher that fails no key takes it out. Written rarely, read by every
// request: a copy-on-write map.
type nodeTrouble struct {
	mu  sync.Mutex
	set atomic.Pointer[map[string]struct{}]
}

// has reports whether node is in trouble.
func (t *nodeTrouble) has(node string) bool {
	m := t.set.Load()
	if m == nil || len(*m) == 0 {
		return false
	}
	_, ok := (*m)[node]
	return ok
}

// any reports whether some node is in trouble.
func (t *nodeTrouble) any() bool {
	m := t.set.Load()
	return m != nil && len(*m) > 0
}

// mark puts node in, or takes it out.
func (t *nodeTrouble) mark(node string, in bool) {
	if t.has(node) == in {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	next := map[string]struct{}{}
	if m := t.set.Load(); m != nil {
		next = maps.Clone(*m)
	}
	if in {
		next[node] = struct{}{}
	} else {
		delete(next, node)
	}
	t.set.Store(&next)
}

// observe updates t from the answer of a batch call of n keys that
// returned err, sent by the batcher of node ("" for the batcher of all
// nodes).
func (t *nodeTrouble) observe(node string, err error, n int) {
	if err == nil {
		if node != "" {
			t.mark(node, false)
		}
		return
	}
	for i := range n {
		var ne *NodeError
		if kerr := KeyError(err, i, n); kerr != nil && errors.As(kerr, &ne) && ne.Node != "" {
			t.mark(ne.Node, true)
		}
	}
}

// nodeOf is the batcher a request of key goes to: its node's own when b
// routes it (with trouble, only a node in trouble), else b.
func (b *batcher[Req, Res]) nodeOf(ctx context.Context, key string) *batcher[Req, Res] {
	if b.route == nil || b.trouble != nil && !b.trouble.any() {
		return b
	}
	n := b.route(ctx, key)
	if n == "" || b.trouble != nil && !b.trouble.has(n) {
		return b
	}
	return b.node(n)
}

// newClaimer batches Store.Claim.
func newClaimer(store Store, timeout time.Duration) *batcher[ClaimRequest, ClaimResult] {
	b := newBatcher("claim", timeout, func(r ClaimRequest) string { return r.Key }, store.Claim)
	b.routeBy(store)
	return b
}

// routeBy batches per node when store, or the store observed wraps, is a
// NodeRouter: the requests of the healthy nodes go in one batch, sent as a
// call a node (sendByNode), and each node in trouble (nodeTrouble) gets a
// batcher of its own while it is.
func (b *batcher[Req, Res]) routeBy(store Store) {
	if o, ok := store.(observed); ok {
		store = o.s
	}
	if r, ok := store.(NodeRouter); ok && r.MultiNode() {
		b.route = r.Node
		b.trouble = &nodeTrouble{}
	}
}

// node returns the batcher of the requests of node n: b itself for "",
// else n's own, made on first use with b's settings.
func (b *batcher[Req, Res]) node(n string) *batcher[Req, Res] {
	if n == "" {
		return b
	}
	if nb := b.subs()[n]; nb != nil {
		return nb
	}
	b.nodesMu.Lock()
	defer b.nodesMu.Unlock()
	nodes := b.subs()
	if nb := nodes[n]; nb != nil {
		return nb
	}
	nb := &batcher[Req, Res]{
		op: b.op, timeout: b.timeout, maxBatch: b.maxBatch, maxFlights: nodeFlights, key: b.key, send: b.send,
		linger: b.linger, idle: b.idle, full: make(chan struct{}, 1), trouble: b.trouble, self: n,
	}
	next := maps.Clone(nodes)
	if next == nil {
		next = make(map[string]*batcher[Req, Res], 1)
	}
	next[n] = nb
	b.nodes.Store(&next)
	return nb
}

// subs returns the per-node batchers made so far, by node; the map is
// never written after it is returned.
func (b *batcher[Req, Res]) subs() map[string]*batcher[Req, Res] {
	if p := b.nodes.Load(); p != nil {
		return *p
	}
	return nil
}

// preparedBatchMax bounds a call of the batch claims of Prepare: several
// partitions' fetches, each up to a chunk (a Kafka source's BatchSize,
// default 100), go together.
const preparedBatchMax = 512

// newPrepareClaimer batches the claims of Prepare, a fetch's keys at once:
// one call in flight, and what other fetches (other partitions) claim
// meanwhile goes together in the next call. At a steady rate a fetch holds
// a message or two, and each would pay a call of its own; in a backlog a
// call is a whole chunk already, and the one flight cost no throughput
// (docs/PERFORMANCE.md, "At a steady 2 000 msgs/s").
func newPrepareClaimer(store Store, timeout time.Duration) *batcher[ClaimRequest, ClaimResult] {
	b := newClaimer(store, timeout)
	b.maxFlights, b.maxBatch = 1, preparedBatchMax
	return b
}

// queued hands n requests just queued to a flusher: the lingering one,
// woken once lingerFull are queued or an urgent one is, or a new one while
// fewer than maxFlights run; else a running flusher takes them after its
// call. b.mu is held.
func (b *batcher[Req, Res]) queued(n int, patient bool) {
	if len(b.pending) == n && b.linger > 0 {
		b.since = time.Now()
	}
	if !patient {
		b.urgent += n
	}
	switch {
	case b.lingering:
		if len(b.pending) >= lingerFull || !patient {
			b.nudge()
		}
	case b.flights < b.maxFlights:
		b.flights++
		b.wg.Go(b.flusher)
	}
}

// await waits, before a flusher takes a batch, while fewer than lingerFull
// requests are queued, all of them patient, more may come (idle), and the
// oldest has waited less than linger. One flusher lingers at a time, and
// queued starts no other meanwhile: a flusher back from its call while
// another lingers ends instead (false), leaving the queue to it.
func (b *batcher[Req, Res]) await() bool {
	if b.linger <= 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lingering {
		b.flights--
		return false
	}
	for len(b.pending) > 0 && len(b.pending) < lingerFull && b.urgent == 0 && !b.closing && (b.idle == nil || !b.idle()) {
		wait := b.linger - time.Since(b.since)
		if wait <= 0 {
			break
		}
		b.lingering = true
		b.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-b.full: // maybe a wake-up meant for an earlier linger: the loop checks
			t.Stop()
		}
		b.mu.Lock()
		b.lingering = false
	}
	return true
}

// do sends req alone or with others. It returns when the batch holding req
// was answered, or when ctx ends (req may still be applied then: as with a
// direct call abandoned after it was sent). A patient request may linger
// (b.linger); pass patient only when no other work waits for the answer,
// such as the next message of an ordered lane.
func (b *batcher[Req, Res]) do(ctx context.Context, req Req, patient bool) (Res, error) {
	if nb := b.nodeOf(ctx, b.key(req)); nb != b {
		return nb.do(ctx, req, patient)
	}
	r, _ := b.free.Get().(*batchReq[Req, Res])
	if r == nil {
		r = &batchReq[Req, Res]{done: make(chan struct{}, 1)}
	}
	r.ctx, r.req, r.patient = ctx, req, patient
	b.mu.Lock()
	b.pending = append(b.pending, r)
	b.queued(1, patient)
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
// patient is do's.
//
// With a route, each node's requests go to its own batcher, and are
// answered as their node answers.
func (b *batcher[Req, Res]) doAll(ctx context.Context, reqs []Req, patient bool) ([]Res, []error) {
	rs := make([]*batchReq[Req, Res], len(reqs))
	for i, req := range reqs {
		r, _ := b.free.Get().(*batchReq[Req, Res])
		if r == nil {
			r = &batchReq[Req, Res]{done: make(chan struct{}, 1)}
		}
		r.ctx, r.req, r.patient = ctx, req, patient
		rs[i] = r
	}
	if b.route == nil || b.trouble != nil && !b.trouble.any() {
		b.enqueue(rs, patient)
	} else {
		// In order of each node's first request, each node's requests
		// in their order.
		var order []string
		by := make(map[string][]*batchReq[Req, Res])
		for _, r := range rs {
			n := b.nodeOf(ctx, b.key(r.req)).self
			if _, ok := by[n]; !ok {
				order = append(order, n)
			}
			by[n] = append(by[n], r)
		}
		for _, n := range order {
			b.node(n).enqueue(by[n], patient)
		}
	}
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

// doEach queues reqs in this batcher (no route is followed) and returns at
// once: then(idx[i], ...) receives request i's answer, on a flusher's
// goroutine, as soon as its batch call returns (it must not block). Every
// request is answered exactly once, with ctx's cause when ctx ends before
// it is sent.
func (b *batcher[Req, Res]) doEach(ctx context.Context, reqs []Req, idx []int, patient bool, then func(idx int, res Res, err error)) {
	ps := make([]*batchReq[Req, Res], len(reqs))
	for i, req := range reqs {
		r, _ := b.free.Get().(*batchReq[Req, Res])
		if r == nil {
			r = &batchReq[Req, Res]{done: make(chan struct{}, 1)}
		}
		r.ctx, r.req, r.patient, r.then, r.idx = ctx, req, patient, then, idx[i]
		ps[i] = r
	}
	b.enqueue(ps, patient)
}

// doEachRouted is doEach with the route: the requests of a node in trouble
// go to its own batcher, the others to b.
func (b *batcher[Req, Res]) doEachRouted(ctx context.Context, reqs []Req, idx []int, patient bool, then func(idx int, res Res, err error)) {
	if b.trouble == nil || !b.trouble.any() {
		b.doEach(ctx, reqs, idx, patient, then)
		return
	}
	by := make(map[*batcher[Req, Res]]int, 2) // batcher -> index in order
	var order []*batcher[Req, Res]
	var rs [][]Req
	var is [][]int
	for i, req := range reqs {
		nb := b.nodeOf(ctx, b.key(req))
		j, ok := by[nb]
		if !ok {
			j = len(order)
			by[nb] = j
			order = append(order, nb)
			rs, is = append(rs, nil), append(is, nil)
		}
		rs[j], is[j] = append(rs[j], req), append(is[j], idx[i])
	}
	for j, nb := range order {
		nb.doEach(ctx, rs[j], is[j], patient, then)
	}
}

// enqueue queues rs, in order, and hands them to a flusher.
func (b *batcher[Req, Res]) enqueue(rs []*batchReq[Req, Res], patient bool) {
	b.mu.Lock()
	b.pending = append(b.pending, rs...)
	b.queued(len(rs), patient)
	b.mu.Unlock()
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
			b.answer(r)
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
	b.urgent = 0
	for _, r := range rest {
		if !r.patient {
			b.urgent++
		}
	}
	if len(b.pending) == 0 {
		b.pending = nil // let the backing array go
	} else if b.linger > 0 {
		b.since = time.Now()
	}
	if len(batch) == 0 {
		b.flights--
	}
	return batch
}

// flusher sends queued requests in batches until the queue is empty.
func (b *batcher[Req, Res]) flusher() {
	for {
		if !b.await() {
			return
		}
		batch := b.next()
		if len(batch) == 0 {
			return
		}
		if b.trouble != nil && b.route != nil && b.self == "" {
			var kept bool
			if b.hedge {
				kept = b.sendHedged(batch)
			} else {
				kept = b.sendByNode(batch, true)
			}
			if !kept {
				return
			}
			continue
		}
		b.sendBatch(batch)
	}
}

// sendBatch sends batch in one call and answers its requests.
func (b *batcher[Req, Res]) sendBatch(batch []*batchReq[Req, Res]) {
	res, err := b.call(b.reqsOf(batch))
	b.answerBatch(batch, res, err)
}

// reqsOf returns the requests of batch, read before any is answered: an
// answered one may be reused at once.
func (b *batcher[Req, Res]) reqsOf(batch []*batchReq[Req, Res]) []Req {
	reqs := make([]Req, len(batch))
	for i, r := range batch {
		reqs[i] = r.req
	}
	return reqs
}

// call sends reqs in one call, under the batcher's timeout.
func (b *batcher[Req, Res]) call(reqs []Req) ([]Res, error) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	return b.send(ctx, reqs)
}

// answerBatch answers batch's requests with the results of their call.
func (b *batcher[Req, Res]) answerBatch(batch []*batchReq[Req, Res], res []Res, err error) {
	n := len(batch)
	if len(res) != n && (err == nil || errors.As(err, new(*BatchError))) {
		err = fmt.Errorf("%w: %s returned %d results for %d keys", ErrStoreUnavailable, b.op, len(res), n)
	}
	if b.trouble != nil {
		b.trouble.observe(b.self, err, n)
	}
	// A BatchError fails its keys alone: the others' results stand.
	for i, r := range batch {
		if kerr := KeyError(err, i, n); kerr != nil {
			r.err = kerr
		} else {
			r.res = res[i]
		}
		b.answer(r)
	}
}

// sendHedged sends batch, whose keys may live on several nodes and whose
// requests may be sent twice (Complete: a completion repeated by its token
// changes nothing), in one call over all nodes, as cheap as a healthy
// cluster allows: on the flusher's own goroutine, watched by a timer. When
// that call has not returned after slowNode, a node may hang: the timer
// hands the flight on, and sends each node's part again as its own call
// (sendByNode), answered as its node answers; the first call's answer,
// when it comes, is dropped. A batch of one node, which is slow, is not
// sent again: its node is put in trouble and the first call answers it.
// It reports whether the flusher keeps its flight: false when it was
// handed on meanwhile.
func (b *batcher[Req, Res]) sendHedged(batch []*batchReq[Req, Res]) bool {
	// state says who answers batch: the first call (answered), or the
	// timer's decision (slow: the first call's answer is dropped when
	// the batch was sent again, else it answers), once decided is closed.
	const (
		pending int32 = iota
		answered
		slow
	)
	var state atomic.Int32
	var resent bool
	decided := make(chan struct{}) // closed when the timer's work is done
	watch := time.AfterFunc(slowNode, func() {
		if !state.CompareAndSwap(pending, slow) {
			return
		}
		defer close(decided)
		// The batch is not answered: its requests stay as they are.
		parts := b.parts(batch)
		if len(parts) == 1 {
			b.troubleAt(parts)
			return
		}
		resent = true
		b.handOn()
		b.sendByNode(batch, false)
	})
	res, err := b.call(b.reqsOf(batch))
	if state.CompareAndSwap(pending, answered) {
		watch.Stop()
		b.answerBatch(batch, res, err)
		return true
	}
	<-decided
	if !resent {
		b.answerBatch(batch, res, err)
	}
	return false
}

// slowNode is how long a node's part of a batch of several nodes may take
// before the node is put in trouble (nodeTrouble) and the batch's flight
// is handed on: a healthy node answers a batch in a millisecond or two,
// and one that hangs would otherwise hold the flight, and with it every
// later batch, until the call's deadline. A node slow for a passing
// reason only costs calls of its own until its next one succeeds.
const slowNode = 100 * time.Millisecond

// part is the requests of one node in a batch.
type part[Req, Res any] struct {
	node  string
	batch []*batchReq[Req, Res]
}

// parts splits batch by node, in order of each node's first request.
func (b *batcher[Req, Res]) parts(batch []*batchReq[Req, Res]) []*part[Req, Res] {
	// Node answers from the store's cache, and within its caller's
	// context when it must read the layout: the first request's.
	rctx := batch[0].ctx
	first := b.route(rctx, b.key(batch[0].req))
	split := len(batch) // index of the first request of another node
	for i, r := range batch[1:] {
		if b.route(rctx, b.key(r.req)) != first {
			split = i + 1
			break
		}
	}
	if split == len(batch) {
		return []*part[Req, Res]{{node: first, batch: batch}}
	}
	// Each request's part, found by a scan of the few primaries (cheaper
	// than a map for every key), then the parts filled in one backing
	// array, each with room for its requests.
	in := make([]int, len(batch))
	parts := []*part[Req, Res]{{node: first}}
	count := []int{split}
	for i, r := range batch[split:] {
		n := b.route(rctx, b.key(r.req))
		pi := -1
		for j, q := range parts {
			if q.node == n {
				pi = j
				break
			}
		}
		if pi < 0 {
			pi = len(parts)
			parts = append(parts, &part[Req, Res]{node: n})
			count = append(count, 0)
		}
		in[split+i] = pi
		count[pi]++
	}
	all := make([]*batchReq[Req, Res], len(batch))
	off := 0
	for j, p := range parts {
		p.batch = all[off : off : off+count[j]]
		off += count[j]
	}
	for i, r := range batch {
		p := parts[in[i]]
		p.batch = append(p.batch, r)
	}
	return parts
}

// sendByNode sends batch, whose keys may live on several nodes, as one
// call a node, the calls concurrently (the first on the caller's
// goroutine), and answers each node's requests when its call returns: a
// node that hangs holds back only its own keys. The calls are the store's
// per-node work of one call over all nodes, so they cost the healthy
// cluster no more round trips; a call per node batcher would (see
// newCompleter). When a node's call is still out after slowNode, its node
// is put in trouble, so that its next requests go to its own batcher, and,
// when the caller holds the flusher's flight (flight), the flight is
// handed on. It returns once every call returned: false when the flight
// was handed on, and the flusher ends.
func (b *batcher[Req, Res]) sendByNode(batch []*batchReq[Req, Res], flight bool) bool {
	parts := b.parts(batch)
	var mu sync.Mutex
	out := make([]bool, len(parts)) // under mu: the parts whose call is out
	handedOn := false               // under mu
	for i := range out {
		out[i] = true
	}
	fired := make(chan struct{}) // closed when the timer's work is done
	watch := time.AfterFunc(slowNode, func() {
		defer close(fired)
		mu.Lock()
		var slowParts []*part[Req, Res]
		for i, p := range parts {
			if out[i] {
				slowParts = append(slowParts, p)
			}
		}
		if len(slowParts) == 0 {
			mu.Unlock()
			return
		}
		handedOn = flight
		mu.Unlock()
		b.markTrouble(slowParts)
		if flight {
			b.handOn()
		}
	})
	send := func(i int) {
		b.sendBatch(parts[i].batch)
		mu.Lock()
		out[i] = false
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for i := 1; i < len(parts); i++ {
		wg.Go(func() { send(i) })
	}
	send(0)
	wg.Wait()
	if !watch.Stop() {
		// The timer fired: it may hand the flight on, which must be done
		// while this flusher still counts in wg.
		<-fired
	}
	mu.Lock()
	defer mu.Unlock()
	return !handedOn
}

// troubleAt puts the nodes of parts, slow to answer, in trouble, and hands
// the flight on.
func (b *batcher[Req, Res]) troubleAt(parts []*part[Req, Res]) {
	b.markTrouble(parts)
	b.handOn()
}

// markTrouble puts the nodes of parts, slow to answer, in trouble.
func (b *batcher[Req, Res]) markTrouble(parts []*part[Req, Res]) {
	for _, p := range parts {
		if p.node != "" {
			b.trouble.mark(p.node, true)
		}
	}
}

// handOn ends the calling flusher's flight while its calls are still out:
// a new flusher takes what is queued.
func (b *batcher[Req, Res]) handOn() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flights--
	if len(b.pending) > 0 && b.flights < b.maxFlights {
		b.flights++
		b.wg.Go(b.flusher)
	}
}

// nudge wakes a lingering flusher, its own and every node's, to check
// again whether to go on.
func (b *batcher[Req, Res]) nudge() {
	select {
	case b.full <- struct{}{}:
	default:
	}
	for _, nb := range b.subs() {
		nb.nudge()
	}
}

// wait blocks until every flusher, its own and every node's, has ended; a
// lingering one sends at once, and none lingers after.
func (b *batcher[Req, Res]) wait() {
	b.mu.Lock()
	b.closing = true
	b.mu.Unlock()
	b.nudge()
	b.wg.Wait()
	if b.route != nil {
		for _, nb := range b.subs() {
			nb.wait()
		}
	}
}
