package kafkasource

import (
	"context"
	"sync"

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
// Callers hold a semaphore slot, so at most size calls run at once, and the
// pool never starts more than size goroutines: when all exist and none is
// idle, a call waits for one that is finishing (it released its call and is
// going back for the next). The member owns the pool and closes it when
// Consume returns, after every lane returned.
type procPool struct {
	pool *gopool.Pool[*procCall]
}

// procCall is one Process call, kept in its delivery (no allocation a
// call); the caller waits on done.
type procCall struct {
	ctx  context.Context
	d    *delivery
	ds   []consumer.Delivery // a run for ProcessBatch; nil for Process
	done sync.WaitGroup
}

func newProcPool(r consumer.Runner, size int) *procPool {
	return &procPool{pool: gopool.New(size, func(c *procCall) {
		if c.ds != nil {
			r.ProcessBatch(c.ctx, c.ds)
		} else {
			r.Process(c.ctx, c.d)
		}
		c.done.Done()
	})}
}

// process runs Process(ctx, d) on a pooled goroutine and returns when it
// returned.
func (pp *procPool) process(ctx context.Context, d *delivery) {
	c := &d.call
	c.ctx, c.d = ctx, d
	c.done.Add(1)
	pp.pool.Run(c)
	c.done.Wait()
	c.ctx, c.d = nil, nil
}

// processBatch runs ProcessBatch(ctx, ds) on a pooled goroutine and returns
// when it returned. The call is kept in the run's first delivery.
func (pp *procPool) processBatch(ctx context.Context, ds []*delivery) {
	run := make([]consumer.Delivery, len(ds))
	for i, d := range ds {
		run[i] = d
	}
	c := &ds[0].call
	c.ctx, c.ds = ctx, run
	c.done.Add(1)
	pp.pool.Run(c)
	c.done.Wait()
	c.ctx, c.ds = nil, nil
}

// close ends the goroutines and waits for them. No call may be running or
// made after it.
func (pp *procPool) close() { pp.pool.Close() }
