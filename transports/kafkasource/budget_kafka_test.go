package kafkasource_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// produceBatches writes, to each of e's partitions, batches record batches
// of perBatch messages with values of valueBytes, one produce call per
// round: kafka-go's writer puts a call's messages for one partition in one
// record batch, which the broker returns whole whatever FetchMaxBytes says
// (as the relay benchmark's producer does). It returns a message's cost.
func produceBatches(e *env, batches, perBatch, valueBytes int) int64 {
	e.t.Helper()
	value := strings.Repeat("v", valueBytes)
	for b := range batches {
		var ms []msg
		for p := range e.parts {
			for i := range perBatch {
				ms = append(ms, msg{partition: p, key: fmt.Sprintf("k%d-%d-%d", p, b, i), value: value})
			}
		}
		e.produce(e.topic, ms)
	}
	m := kafka.Message{Key: []byte("k0-0-00"), Value: []byte(value)}
	return kafkasource.MessageCost(&m)
}

// orderedLog records the offsets each partition's handler saw, in order.
type orderedLog struct {
	mu   sync.Mutex
	seen map[int][]int64
}

func (l *orderedLog) add(m *consumer.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[int][]int64{}
	}
	l.seen[m.Origin.Partition] = append(l.seen[m.Origin.Partition], m.Origin.Offset)
}

// check fails t unless every partition of ends saw each of its offsets
// once, in offset order.
func (l *orderedLog) check(t *testing.T, ends map[int]int64) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, end := range ends {
		want := make([]int64, end)
		for i := range want {
			want[i] = int64(i)
		}
		if !slices.Equal(l.seen[p], want) {
			t.Errorf("partition %d handled offsets %v, want 0 to %d once each, in order", p, l.seen[p], end-1)
		}
	}
}

// finishAndCheck waits until every partition of e's topic is committed to its
// end, stops r, and checks that log saw each partition's offsets once, in
// order.
func finishAndCheck(t *testing.T, e *env, r *testenv.Running, log *orderedLog, partitions int) {
	t.Helper()
	ends := e.ends(e.topic, partitions)
	testenv.Eventually(t, 60*time.Second, "every partition committed to its end", func() bool {
		return reachedEnds(e.committed(), ends)
	})
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	log.check(t, ends)
}

// TestFetchBudgetBoundsHeldMessages: with every handler stuck, the source
// holds no more fetched messages than FetchBufferBytes plus one fetch (the
// one whose record batch turned out larger than it acquired for), where
// without the bound every partition would hold its fetch: the budget
// stops the fetchers of the partitions it has no room for. Once the
// handlers are released, every partition's messages are handled in offset
// order, the group commits every partition's end, and the source gives
// the whole budget back.
func TestFetchBudgetBoundsHeldMessages(t *testing.T) {
	t.Parallel()
	const (
		partitions = 4
		perBatch   = 40
		valueBytes = 1 << 10
		fetchBytes = 16 << 10 // below one batch: a fetch is one whole batch
		bufBytes   = 100 << 10
	)
	e := newRealEnv(t, partitions)
	cost := produceBatches(e, 1, perBatch, valueBytes)
	oneFetch := perBatch * cost
	if all := partitions * oneFetch; all <= bufBytes+oneFetch {
		t.Fatalf("the test's numbers are wrong: every partition's fetch (%d bytes) fits in the bound (%d)", all, bufBytes+oneFetch)
	}

	release := make(chan struct{})
	var log orderedLog
	var started atomic.Int64
	startedOn := make([]atomic.Bool, partitions)
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		started.Add(1)
		startedOn[m.Origin.Partition].Store(true)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		log.add(m)
		return nil, nil
	})
	src := e.source(func(c *kafkasource.Config) {
		c.FetchMaxBytes = fetchBytes
		c.FetchBufferBytes = bufBytes
		c.BatchSize = 10
		c.MaxUnfinished = 10
	})
	r := run(t, worker(t, "budget-bound", src, h))

	// The first partitions' fetches fill the budget; the next fetcher
	// waits for room.
	testenv.Eventually(t, 30*time.Second, "a fetcher waiting for the budget", func() bool {
		_, _, waiting := kafkasource.FetchBudget(src)
		return waiting > 0
	})
	used, peak, _ := kafkasource.FetchBudget(src)
	if bound := int64(bufBytes) + oneFetch; peak > bound {
		t.Errorf("the source held %d bytes of fetched messages (%d messages), want at most FetchBufferBytes + one fetch = %d (%d messages)", peak, peak/cost, bound, bound/cost)
	}
	if used < oneFetch {
		t.Errorf("the source holds %d bytes while a fetcher waits, want at least one fetch (%d): what waits for room?", used, oneFetch)
	}
	n := 0
	for i := range startedOn {
		if startedOn[i].Load() {
			n++
		}
	}
	if n == partitions {
		t.Errorf("messages of all %d partitions started while the budget had room for about %d fetches", partitions, bufBytes/oneFetch+1)
	}

	close(release)
	finishAndCheck(t, e, r, &log, partitions)
	if got := started.Load(); got != partitions*perBatch {
		t.Errorf("handlers started %d times, want %d (each message once)", got, partitions*perBatch)
	}
	if _, peak, _ := kafkasource.FetchBudget(src); peak > int64(bufBytes)+oneFetch {
		t.Errorf("over the whole run the source held up to %d bytes, want at most %d", peak, int64(bufBytes)+oneFetch)
	}
	if used, _, waiting := kafkasource.FetchBudget(src); used != 0 || waiting != 0 {
		t.Errorf("after Run returned the budget has %d bytes held and %d waiters, want 0 and 0", used, waiting)
	}
	if st := src.FetchBufferStats(); st.Size != bufBytes || st.Held != 0 || st.Waited <= 0 {
		t.Errorf("FetchBufferStats = %+v, want size %d, nothing held and some time waited: a fetcher waited for room", st, bufBytes)
	}
}

// TestFetchBudgetEveryPartitionProgresses: a budget smaller than any one
// fetch lets one partition's fetch be held at a time; fetchers take turns
// in the order they asked, so every partition's every batch is handled,
// each partition in offset order, and every partition's end is committed.
func TestFetchBudgetEveryPartitionProgresses(t *testing.T) {
	t.Parallel()
	const (
		partitions = 4
		batches    = 3
		perBatch   = 30
		fetchBytes = 8 << 10
	)
	e := newRealEnv(t, partitions)
	cost := produceBatches(e, batches, perBatch, 1<<10)
	if perBatch*cost <= fetchBytes {
		t.Fatalf("the test's numbers are wrong: a batch (%d bytes) fits in the budget (%d)", perBatch*cost, fetchBytes)
	}
	var log orderedLog
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		log.add(m)
		return nil, nil
	})
	src := e.source(func(c *kafkasource.Config) {
		c.FetchMaxBytes = fetchBytes
		c.FetchBufferBytes = fetchBytes
		c.BatchSize = 10
	})
	r := run(t, worker(t, "budget-progress", src, h))
	finishAndCheck(t, e, r, &log, partitions)
	// One fetch at a time: the budget held one batch and what the next
	// fetcher acquired before it (at most the whole budget).
	if _, peak, _ := kafkasource.FetchBudget(src); peak > perBatch*cost+fetchBytes {
		t.Errorf("the source held up to %d bytes, want at most one batch and one acquisition, %d", peak, perBatch*cost+fetchBytes)
	}
	if used, _, _ := kafkasource.FetchBudget(src); used != 0 {
		t.Errorf("after Run returned the budget has %d bytes held, want 0", used)
	}
}

// TestFetchBudgetReleasedOnStop: messages that were fetched and never
// acked (the handlers were stuck when the source stopped) give their bytes
// back once the partitions' goroutines return, so the next Consume of the
// same Source starts with the whole budget, and handles those messages.
func TestFetchBudgetReleasedOnStop(t *testing.T) {
	t.Parallel()
	e := newRealEnv(t, 2)
	produceBatches(e, 1, 50, 512)
	var stuck atomic.Int64
	blocking := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		stuck.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	src := e.source(func(c *kafkasource.Config) { c.BatchSize = 10 })
	r := run(t, worker(t, "budget-stop", src, blocking))
	testenv.Eventually(t, 30*time.Second, "both partitions' handlers stuck", func() bool { return stuck.Load() >= 2 })
	if used, _, _ := kafkasource.FetchBudget(src); used == 0 {
		t.Fatal("the budget holds nothing while two partitions hold fetched messages")
	}
	_ = r.Stop(t, 30*time.Second) // the stuck handlers return the cancellation
	if used, _, waiting := kafkasource.FetchBudget(src); used != 0 || waiting != 0 {
		t.Fatalf("after Run returned the budget has %d bytes held and %d waiters, want 0 and 0", used, waiting)
	}

	var log orderedLog
	r = run(t, worker(t, "budget-stop", src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		log.add(m)
		return nil, nil
	})))
	finishAndCheck(t, e, r, &log, 2)
}

// TestFirstFetchesDoNotLongPoll: first fetches run one at a time (their
// size is unknown), so one that long-polled an empty partition would keep
// the next partition's first fetch waiting MaxWait. With one message on
// the last of eight partitions and the rest empty, that message is handled
// well within one MaxWait of the first fetch.
func TestFirstFetchesDoNotLongPoll(t *testing.T) {
	t.Parallel()
	const (
		partitions = 8
		maxWait    = 5 * time.Second
	)
	e := newRealEnv(t, partitions)
	e.produce(e.topic, []msg{{partition: partitions - 1, value: "only"}})
	handled := make(chan time.Time, 1)
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		select {
		case handled <- time.Now():
		default:
		}
		return nil, nil
	})
	src := e.source(func(c *kafkasource.Config) { c.MaxWait = maxWait })
	r := run(t, worker(t, "first-fetch", src, h))
	// A fetch in progress holds some of the budget: the first one has
	// started once it is not empty.
	testenv.Eventually(t, 30*time.Second, "a first fetch", func() bool {
		used, _, _ := kafkasource.FetchBudget(src)
		return used > 0
	})
	first := time.Now()
	select {
	case at := <-handled:
		if d := at.Sub(first); d > maxWait/2 {
			t.Errorf("the message was handled %v after the first fetch began, want well within MaxWait %v: first fetches waited for each other's long polls", d, maxWait)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the message was not handled within 30s")
	}
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
}

// liveHeap returns the bytes of live heap objects, after a collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC() // the first collection's finalizers may free more
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestFetchBudgetCountsHeapHeld: what the budget counts for a fetched
// message is what the source holds on the heap for it, within a fifth,
// whatever its headers: with every handler stuck and every message of the
// topic fetched (the budget then holds their count and, for each fetcher
// long-polling its partition's end, FetchMaxBytes), the live heap falls by
// about the budget's count a message once they are all acked. It runs alone (no t.Parallel): the heap is the
// whole process's.
func TestFetchBudgetCountsHeapHeld(t *testing.T) {
	cases := []struct {
		name             string
		headers          int
		valueBytes, hdrB int
	}{
		{"no headers", 0, 100, 0},
		{"one header", 1, 100, 36},
		{"four headers", 4, 100, 36},
		{"sixteen headers", 16, 100, 36},
		{"large values", 2, 4000, 400},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const partitions, per, fetchMax = 2, 4000, 1 << 20
			e := newRealEnv(t, partitions)
			value := strings.Repeat("v", c.valueBytes)
			hdrs := func() []kafka.Header {
				var hs []kafka.Header
				for i := range c.headers {
					hs = append(hs, kafka.Header{Key: fmt.Sprintf("Header-%02d", i), Value: []byte(strings.Repeat("h", c.hdrB))})
				}
				return hs
			}
			var ms []msg
			for p := range partitions {
				for i := range per {
					ms = append(ms, msg{partition: p, key: fmt.Sprintf("k%07d", i), value: value, headers: hdrs()})
				}
			}
			e.produce(e.topic, ms)
			cost := kafkasource.MessageCost(&kafka.Message{Key: []byte("k0000000"), Value: []byte(value), Headers: hdrs()})
			all := int64(partitions*per) * cost

			release := make(chan struct{})
			h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil, nil
			})
			src := e.source(func(c *kafkasource.Config) {
				c.FetchMaxBytes = fetchMax
				c.FetchBufferBytes = int(2 * all)
				c.MaxUnfinished = per // a partition fetches all of its messages, then no more
				c.BatchSize = 100
			})
			r := run(t, worker(t, "budget-heap", src, h))
			testenv.Eventually(t, 60*time.Second, "every message fetched, and each fetcher long-polling the partition's end", func() bool {
				used, _, _ := kafkasource.FetchBudget(src)
				return used == all+partitions*fetchMax
			})
			held := liveHeap()
			close(release)
			ends := e.ends(e.topic, partitions)
			testenv.Eventually(t, 60*time.Second, "every partition committed to its end", func() bool {
				return reachedEnds(e.committed(), ends)
			})
			done := liveHeap()
			if err := r.Stop(t, 30*time.Second); err != nil {
				t.Fatalf("Run returned %v, want nil", err)
			}
			perMsg := (float64(held) - float64(done)) / float64(partitions*per)
			t.Logf("the budget counts %d B a message; the heap held %.0f B a message", cost, perMsg)
			if ratio := perMsg / float64(cost); ratio < 0.8 || ratio > 1.2 {
				t.Errorf("the source held %.0f B of heap a message, the budget counts %d (ratio %.2f): FetchBufferBytes does not bound what it says", perMsg, cost, ratio)
			}
		})
	}
}
