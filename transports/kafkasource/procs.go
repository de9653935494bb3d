package kafkasource

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/gopool"
)

// procPool runs Runner.Process calls on long-lived goroutines for lanes that
// hold a slot of the member's semaphore. A lane is a goroutine of its own
// (with key ordering and keyless messages, one per message), and running
// Process on it would grow its fresh stack, through the engine and the
// Redis client, every time. Pooled goroutines keep their grown stacks; the
// lane waits, on a shallow stack, for its call to return (runtime.newstack
// in a CPU profile of the Kafka relay).
//
// Callers hold a semaphore slot, and the pooled goroutine gives it back
// when its call returns: a run whose handlers are done may still be
// storing its results when its lane has gone on (startBatch). So at most
// size calls run at once, and the pool never starts more than size
// goroutines: when all exist and none is idle, a call waits for one that is
// finishing (it released its call and is going back for the next). The
// member owns the pool and closes it when Consume returns, after every lane
// returned.
type procPool struct {
	pool *gopool.Pool[*procCall]
}

// procCall is one Process or ProcessBatch call, kept in its delivery (the
// run's first for ProcessBatch: no allocation a call).
type procCall struct {
	ctx context.Context
	d   *delivery
	ds  []consumer.Delivery // a run for ProcessBatch; nil for Process
	run []*delivery         // the same run, for its lane

	done sync.WaitGroup // Process: the caller waits on it
	// A ProcessBatch call reports on ev: false once its handlers are done
	// (the run's first delivery is notified, [consumer.RunHandledNotifier]), true
	// when the call returned. state makes the first report of each kind
	// the only one: callIdle, callRunning, then callHandled, then
	// callReturned.
	ev    chan bool
	state atomic.Int32
}

const (
	callIdle int32 = iota // no ProcessBatch call started on it
	callRunning
	callHandled
	callReturned
)

func newProcPool(r consumer.Runner, size int, sem <-chan struct{}) *procPool {
	return &procPool{pool: gopool.New(size, func(c *procCall) {
		if c.ds != nil {
			r.ProcessBatch(c.ctx, c.ds)
			<-sem
			c.state.Store(callReturned)
			c.ev <- true
			return
		}
		r.Process(c.ctx, c.d)
		<-sem
		c.done.Done()
	})}
}

// process runs Process(ctx, d) on a pooled goroutine and returns when it
// returned. The caller holds a semaphore slot, which the call gives back.
func (pp *procPool) process(ctx context.Context, d *delivery) {
	c := &d.call
	c.ctx, c.d = ctx, d
	c.done.Add(1)
	pp.pool.Run(c)
	c.done.Wait()
	c.ctx, c.d = nil, nil
}

// startBatch starts ProcessBatch(ctx, run) on a pooled goroutine and
// returns its call, kept in the run's first delivery. The caller holds a
// semaphore slot, which the call gives back when it returns; the caller
// waits on the call with handledOrReturned and wait.
func (pp *procPool) startBatch(ctx context.Context, run []*delivery) *procCall {
	ds := make([]consumer.Delivery, len(run))
	for i, d := range run {
		ds[i] = d
	}
	c := &run[0].call
	if c.ev == nil {
		c.ev = make(chan bool, 2)
	}
	c.ctx, c.ds, c.run = ctx, ds, run
	c.state.Store(callRunning)
	pp.pool.Run(c)
	return c
}

// handled reports that the run's handlers are done; only the first report
// of a running ProcessBatch call counts.
func (c *procCall) handled() {
	if c.state.CompareAndSwap(callRunning, callHandled) {
		c.ev <- false
	}
}

// handledOrReturned waits until the call's handlers are done or the call
// returned, and reports whether it returned. A call that returned is
// forgotten.
func (c *procCall) handledOrReturned() bool {
	if <-c.ev {
		c.ctx, c.ds = nil, nil
		return true
	}
	return false
}

// wait waits, after handledOrReturned reported the call's handlers done,
// until the call returned, and forgets it.
func (c *procCall) wait() {
	<-c.ev
	c.ctx, c.ds = nil, nil
}

// returnedOr waits, after handledOrReturned reported the call's handlers
// done, until the call returned, then forgets it and reports true; or until
// wake has a token, and reports false.
func (c *procCall) returnedOr(wake <-chan struct{}) bool {
	select {
	case <-c.ev:
		c.ctx, c.ds = nil, nil
		return true
	case <-wake:
		return false
	}
}

// close ends the goroutines and waits for them. No call may be running or
// made after it.
func (pp *procPool) close() { pp.pool.Close() }
