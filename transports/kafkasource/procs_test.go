package kafkasource

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// countingRunner counts Process calls and the most that overlapped; each
// blocks until release is closed.
type countingRunner struct {
	running, peak atomic.Int32
	calls         atomic.Int32
	release       chan struct{}
}

func (r *countingRunner) Name() string                                 { return "t" }
func (r *countingRunner) Concurrency() int                             { return 3 }
func (r *countingRunner) Prepare(context.Context, []consumer.Delivery) {}
func (r *countingRunner) Batching() bool                               { return false }
func (r *countingRunner) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	for _, d := range ds {
		r.Process(ctx, d)
	}
}
func (r *countingRunner) Process(_ context.Context, d consumer.Delivery) {
	n := r.running.Add(1)
	for {
		p := r.peak.Load()
		if n <= p || r.peak.CompareAndSwap(p, n) {
			break
		}
	}
	<-r.release
	r.calls.Add(1)
	r.running.Add(-1)
}

// TestProcPool: process returns only after Process returned, the pool never
// starts more goroutines than its size however many calls are made, each
// call gives its caller's slot back, and close waits for them.
func TestProcPool(t *testing.T) {
	r := &countingRunner{release: make(chan struct{})}
	sem := make(chan struct{}, 3) // callers hold a slot, as lanes do
	pp := newProcPool(r, 3, sem)
	var wg sync.WaitGroup
	returned := atomic.Int32{}
	for range 30 {
		wg.Go(func() {
			sem <- struct{}{}
			d := &delivery{}
			pp.process(context.Background(), d)
			returned.Add(1)
		})
	}
	// Three calls run and block; none may have returned.
	deadline := time.Now().Add(5 * time.Second)
	for r.running.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls running, want 3", r.running.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if n := returned.Load(); n != 0 {
		t.Fatalf("%d process calls returned before their Process did", n)
	}
	close(r.release)
	wg.Wait()
	if got := r.calls.Load(); got != 30 {
		t.Fatalf("%d Process calls, want 30", got)
	}
	if p := r.peak.Load(); p > 3 {
		t.Fatalf("%d Process calls overlapped, want at most 3", p)
	}
	if n := pp.pool.Started(); n > 3 {
		t.Fatalf("the pool started %d goroutines, want at most its size 3", n)
	}
	if n := len(sem); n != 0 {
		t.Fatalf("%d semaphore slots still held after every call returned", n)
	}
	pp.close() // returns when its goroutines did
}

// batchRunner's ProcessBatch notifies its run's source that its handlers
// are done when notify is set, then waits for release before it returns.
type batchRunner struct {
	countingRunner
	notify  bool
	entered chan struct{}
}

func (r *batchRunner) Batching() bool { return true }
func (r *batchRunner) ProcessBatch(_ context.Context, ds []consumer.Delivery) {
	r.entered <- struct{}{}
	if r.notify {
		dispatch.RunHandled(ds)
		dispatch.RunHandled(ds) // a second notice is ignored
	}
	<-r.release
}

// TestProcPoolBatchReports: a ProcessBatch call reports its handlers done
// when the processor notifies the run's first delivery, and its return
// afterwards; it holds its semaphore slot until it returns. A call that
// never notifies reports only its return.
func TestProcPoolBatchReports(t *testing.T) {
	for _, notify := range []bool{true, false} {
		r := &batchRunner{countingRunner: countingRunner{release: make(chan struct{})}, notify: notify, entered: make(chan struct{}, 1)}
		sem := make(chan struct{}, 1)
		pp := newProcPool(r, 1, sem)
		run := []*delivery{{}, {}}
		// A delivery that is not the first of a running call ignores a
		// notice.
		run[1].RunHandled()

		sem <- struct{}{}
		c := pp.startBatch(context.Background(), run)
		<-r.entered
		if notify {
			if c.handledOrReturned() {
				t.Fatal("the call reported its return before ProcessBatch returned")
			}
			if len(sem) != 1 {
				t.Fatal("the call gave its slot back before it returned")
			}
			close(r.release)
			c.wait()
		} else {
			select {
			case v := <-c.ev:
				t.Fatalf("a call that was not notified reported %v before it returned", v)
			default:
			}
			close(r.release)
			if !c.handledOrReturned() {
				t.Fatal("a call that was not notified reported its handlers done")
			}
		}
		if len(sem) != 0 {
			t.Fatal("the call kept its slot after it returned")
		}
		if len(c.ev) != 0 {
			t.Fatalf("%d reports left after the call returned", len(c.ev))
		}
		pp.close()
	}
}
