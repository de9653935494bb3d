package kafkasource

import (
	"context"
	"sync"
	"time"
	"unsafe"

	"github.com/segmentio/kafka-go"
)

// budget bounds the memory a Source holds in fetched messages, across all
// its partitions (Config.FetchBufferBytes). A partition's fetcher acquires
// its fetch's expected cost before it fetches; the cost is released message
// by message as each is acked, and whatever a partition still holds when
// its goroutines have returned is released then.
//
// Waiters are served first come, first served, and a request is never
// larger than the whole budget: a fetcher waits only for messages that were
// fetched before it asked, and those finish without the budget (they are
// already dispatched or dispatchable), so every partition's fetcher gets
// its turn. What a fetch decodes beyond what its fetcher acquired is taken
// without waiting (take): it is in memory already. The budget can then be
// exceeded by that excess, and nobody else acquires until it is back under.
type budget struct {
	size int64

	mu      sync.Mutex
	used    int64
	peak    int64
	waited  time.Duration // summed over the acquisitions that waited
	waiters []*budgetWaiter
}

type budgetWaiter struct {
	n     int64
	ready chan struct{} // closed when the bytes are granted
}

func newBudget(size int64) *budget { return &budget{size: size} }

// capped returns n limited to the whole budget: a request the budget can
// grant once everything else is released.
func (b *budget) capped(n int64) int64 { return max(min(n, b.size), 1) }

// acquire waits until n bytes (at most the whole budget, see capped) are
// free and no earlier caller waits, and takes them. It returns ctx's error,
// holding nothing, when ctx ends first.
func (b *budget) acquire(ctx context.Context, n int64) error {
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.size {
		b.grant(n)
		b.mu.Unlock()
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	start := time.Now()
	select {
	case <-w.ready:
		b.mu.Lock()
		b.waited += time.Since(start)
		b.mu.Unlock()
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		b.waited += time.Since(start)
		select {
		case <-w.ready:
			// Granted meanwhile: give it back.
			b.used -= n
		default:
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

// take takes n bytes without waiting, even past the budget.
func (b *budget) take(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.grant(n)
	b.mu.Unlock()
}

// release gives n bytes back and grants waiters, in order, while the first
// of them fits.
func (b *budget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.wake()
	b.mu.Unlock()
}

// grant takes n bytes; b.mu is held.
func (b *budget) grant(n int64) {
	b.used += n
	b.peak = max(b.peak, b.used)
}

// wake grants the waiters at the head that fit; b.mu is held.
func (b *budget) wake() {
	for len(b.waiters) > 0 {
		w := b.waiters[0]
		if b.used+w.n > b.size {
			return
		}
		b.grant(w.n)
		close(w.ready)
		b.waiters[0] = nil
		b.waiters = b.waiters[1:]
	}
}

// stats returns the budget's size, the bytes in use and how long
// acquisitions have waited in all.
func (b *budget) stats() FetchBufferStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return FetchBufferStats{Size: b.size, Held: b.used, Waited: b.waited}
}

// state returns the bytes in use, the most ever in use and how many
// callers wait.
func (b *budget) state() (used, peak int64, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.peak, len(b.waiters)
}

// kafkaGoRecord approximates what kafka-go's decoding of a record holds
// beside its key, value and headers until the source has converted it: its
// offset, time and two page references into the decompressed batch.
const kafkaGoRecord = 128

// recordOverhead is what a fetched message costs beside its bytes: its
// kafka.Message in its fetch's block, its delivery (which references it
// there) and kafka-go's decoded record.
const recordOverhead = int64(unsafe.Sizeof(kafka.Message{})+unsafe.Sizeof(delivery{})) + kafkaGoRecord

// A message's headers are held twice: kafka-go decodes each into its own
// key and value allocations, which the kafka.Message keeps, and the
// delivery's consumer.Header is a map whose values are copies
// (headerSpace). TestFetchBudgetCountsHeapHeld checks these figures
// against the heap a source holds.
const (
	// headerEntry is one header beside its key and value bytes: its
	// kafka.Header in kafka-go's slice, the string of the copied value,
	// and the size-class rounding of kafka-go's two allocations.
	headerEntry = int64(unsafe.Sizeof(kafka.Header{})+unsafe.Sizeof("")) + 16
	// headerMapSmall is a consumer.Header of up to mapGroupSlots keys: the
	// map and the one group of slots it has then.
	headerMapSmall = 464
	// headerMapKey is a larger map's cost a key: its table keeps at least
	// one free slot in every group and grows by doubling.
	headerMapKey = 115
	// mapGroupSlots is how many keys a Go map's group holds.
	mapGroupSlots = 8
)

// messageCost is what the budget counts for m: its key, value and header
// bytes (each held by kafka-go's decoding and copied by the source) and
// recordOverhead.
func messageCost(m *kafka.Message) int64 {
	n := int64(len(m.Key)+len(m.Value)) + recordOverhead
	if len(m.Headers) == 0 {
		return n
	}
	for _, h := range m.Headers {
		n += int64(len(h.Key)+2*len(h.Value)) + headerEntry
	}
	return n + headerMapCost(len(m.Headers))
}

// headerMapCost is what the consumer.Header map of a message with n > 0
// headers costs beside its entries.
func headerMapCost(n int) int64 {
	if n <= mapGroupSlots {
		return headerMapSmall
	}
	return int64(n) * headerMapKey
}
