package kafkasource

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
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
// starts more goroutines than its size however many calls are made, and
// close waits for them.
func TestProcPool(t *testing.T) {
	r := &countingRunner{release: make(chan struct{})}
	pp := newProcPool(r, 3)
	sem := make(chan struct{}, 3) // callers hold a slot, as lanes do
	var wg sync.WaitGroup
	returned := atomic.Int32{}
	for range 30 {
		wg.Go(func() {
			sem <- struct{}{}
			d := &delivery{}
			pp.process(context.Background(), d)
			returned.Add(1)
			<-sem
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
	pp.close() // returns when its goroutines did
}
