package bytebudget

import (
	"context"
	"sync"
	"time"
)

// Budget bounds the bytes a source holds in received messages that are not
// yet done. A receiver acquires a message's (or a fetch's expected) cost
// before it takes it, and releases it as the message is settled.
//
// Waiters are served first come, first served, and a caller keeps its
// requests within the whole budget (Capped), so that a request can always
// be granted once everything held before it is released: a receiver then
// waits only for messages taken before it asked, which finish without the
// budget. What turns out to be in memory beyond what was acquired is taken
// without waiting (Take); the budget can then be exceeded by that excess,
// and nobody else acquires until it is back under.
type Budget struct {
	size int64

	mu      sync.Mutex
	used    int64
	peak    int64
	waited  time.Duration // summed over the finished waits (granted or given up)
	waiters []*budgetWaiter
}

type budgetWaiter struct {
	n     int64
	start time.Time
	ready chan struct{} // closed when the bytes are granted
}

// New returns a budget of size bytes.
func New(size int64) *Budget { return &Budget{size: size} }

// Capped returns n limited to the whole budget: a request the budget can
// grant once everything else is released.
func (b *Budget) Capped(n int64) int64 { return max(min(n, b.size), 1) }

// Acquire waits until n bytes (at most the whole budget, see Capped) are
// free and no earlier caller waits, and takes them. It returns ctx's error,
// holding nothing, when ctx ends first.
func (b *Budget) Acquire(ctx context.Context, n int64) error {
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.size {
		b.grant(n)
		b.mu.Unlock()
		return nil
	}
	w := &budgetWaiter{n: n, start: time.Now(), ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		select {
		case <-w.ready:
			// Granted meanwhile: give it back.
			b.used -= n
		default:
			b.waited += time.Since(w.start)
			for i, o := range b.waiters {
				if o == w {
					b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
					break
				}
			}
		}
		// The head may have changed, or bytes come back: wake who fits.
		b.wake()
		b.mu.Unlock()
		return ctx.Err()
	}
}

// Take takes n bytes without waiting, even past the budget.
func (b *Budget) Take(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.grant(n)
	b.mu.Unlock()
}

// Release gives n bytes back and grants waiters, in order, while the first
// of them fits.
func (b *Budget) Release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.wake()
	b.mu.Unlock()
}

// grant takes n bytes; b.mu is held.
func (b *Budget) grant(n int64) {
	b.used += n
	b.peak = max(b.peak, b.used)
}

// wake grants the waiters at the head that fit; b.mu is held. A waiter's
// time counts in waited from its grant, under b.mu, so that Stats, which
// counts the waits in progress too, never goes back.
func (b *Budget) wake() {
	var now time.Time
	for len(b.waiters) > 0 {
		w := b.waiters[0]
		if b.used+w.n > b.size {
			return
		}
		if now.IsZero() {
			now = time.Now()
		}
		b.waited += now.Sub(w.start)
		b.grant(w.n)
		close(w.ready)
		b.waiters[0] = nil
		b.waiters = b.waiters[1:]
	}
}

// Stats returns the budget's size, the bytes in use and how long
// acquisitions have waited in all, the waits still in progress included.
func (b *Budget) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	waited := b.waited
	if len(b.waiters) > 0 {
		now := time.Now()
		for _, w := range b.waiters {
			waited += now.Sub(w.start)
		}
	}
	return Stats{Size: b.size, Held: b.used, Waited: waited}
}

// State returns the bytes in use, the most ever in use and how many
// callers wait.
func (b *Budget) State() (used, peak int64, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.peak, len(b.waiters)
}

// Stats is a snapshot of a budget.
type Stats struct {
	// Size is the budget's size.
	Size int64
	// Held is what is acquired or taken and not yet released; Take can
	// take it past Size.
	Held int64
	// Waited is the time acquisitions have spent waiting, summed over
	// them: granted, given up, or still waiting.
	Waited time.Duration
}

// A header map (consumer.Header, nats.Header: map[string][]string) costs
// beside its entries what these constants say; kafkasource's
// TestFetchBudgetCountsHeapHeld checks them against the heap.
const (
	// headerMapSmall is a map of up to mapGroupSlots keys: the map and
	// the one group of slots it has then.
	headerMapSmall = 464
	// headerMapKey is a larger map's cost a key: its table keeps at least
	// one free slot in every group and grows by doubling.
	headerMapKey = 115
	// mapGroupSlots is how many keys a Go map's group holds.
	mapGroupSlots = 8
)

// HeaderMapCost is what a map[string][]string of n > 0 keys costs beside
// its keys and values.
func HeaderMapCost(n int) int64 {
	if n <= mapGroupSlots {
		return headerMapSmall
	}
	return int64(n) * headerMapKey
}
