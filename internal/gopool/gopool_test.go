package gopool

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPoolBoundsAndReuses: items held to size in flight by their callers run
// on at most size goroutines, every item runs once, and Close waits for the
// item still running.
func TestPoolBoundsAndReuses(t *testing.T) {
	const size, items = 3, 30
	release := make(chan struct{})
	var running, peak, ran atomic.Int32
	p := New(size, func(int) {
		n := running.Add(1)
		for {
			old := peak.Load()
			if n <= old || peak.CompareAndSwap(old, n) {
				break
			}
		}
		<-release
		running.Add(-1)
		ran.Add(1)
	})
	sem := make(chan struct{}, size) // at most size callers at once
	var callers sync.WaitGroup
	for i := range items {
		sem <- struct{}{}
		callers.Go(func() {
			defer func() { <-sem }()
			p.Run(i)
		})
		if i == size-1 {
			// Every slot is taken by a running item: no more can start
			// until one is released.
			deadline := time.Now().Add(5 * time.Second)
			for running.Load() < size {
				if time.Now().After(deadline) {
					t.Fatalf("%d items running, want %d", running.Load(), size)
				}
				time.Sleep(time.Millisecond)
			}
			close(release)
		}
	}
	callers.Wait()
	// The last items may still be in fn: Close must wait for them.
	p.Close()
	if got := ran.Load(); got != items {
		t.Fatalf("Close returned with %d of %d items run", got, items)
	}
	if got := p.Started(); got > size {
		t.Fatalf("%d goroutines started, want at most %d", got, size)
	}
	if got := peak.Load(); got > size {
		t.Fatalf("%d items ran at once, want at most %d", got, size)
	}
}
