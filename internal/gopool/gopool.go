package gopool

import "sync"

// Pool runs fn on items handed to Run, on at most size goroutines, started
// when an item finds none idle (an idle or lightly loaded pool holds few).
// Callers bound the items in flight to size (the transports hold a
// concurrency slot per item), so Run never waits long: with every goroutine
// started, one is idle or about to be.
type Pool[T any] struct {
	fn   func(T)
	work chan T
	size int

	mu sync.Mutex
	n  int // goroutines started
	wg sync.WaitGroup
}

// New returns a Pool running fn on at most size goroutines (at least one).
func New[T any](size int, fn func(T)) *Pool[T] {
	return &Pool[T]{fn: fn, work: make(chan T), size: max(size, 1)}
}

// Run hands x to an idle goroutine, or starts one; with size goroutines
// started and none idle it waits for one. It must not be called after Close.
func (p *Pool[T]) Run(x T) {
	select {
	case p.work <- x:
		return
	default:
	}
	p.mu.Lock()
	start := p.n < p.size
	if start {
		p.n++
	}
	p.mu.Unlock()
	if start {
		p.wg.Go(func() { p.loop(x) })
		return
	}
	p.work <- x
}

func (p *Pool[T]) loop(x T) {
	for {
		p.fn(x)
		var ok bool
		if x, ok = <-p.work; !ok {
			return
		}
	}
}

// Close ends the goroutines once they finished their items, and waits for
// them.
func (p *Pool[T]) Close() {
	close(p.work)
	p.wg.Wait()
}

// Started reports how many goroutines the pool started.
func (p *Pool[T]) Started() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
