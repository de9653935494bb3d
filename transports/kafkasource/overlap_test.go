package kafkasource_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// overlapping is a Processor that tells the source when a run's
// handlers are done (consumer.RunHandledNotifier) and then holds the run in
// ProcessBatch, as a result being stored would, until the lane's next run
// has started. The run that holds the partition's last offset is not held.
// It naks the offsets of nakOnce on their first attempt after the notice,
// as the engine naks a result it could not store. It reports that it
// batches unless single is set; the lane then hands it runs of one, which
// the engine reports handled as it does runs (a plain handler's run of one,
// idempotency's ProcessBatch).
type overlapping struct {
	t       *testing.T
	single  bool
	last    int64 // the partition's last offset
	nakOnce map[int64]bool
	// committed reads the group's committed offset of the partition.
	committed func() int64

	mu        sync.Mutex
	runs      [][]int64
	started   map[int]chan struct{} // closed when run k entered ProcessBatch
	active    int                   // ProcessBatch calls not returned
	maxActive int
	acked     map[int64]int
	retries   map[int64]int // a retried offset: how many runs had started when it ran
	problems  []string
}

func (p *overlapping) startedCh(k int) chan struct{} {
	c, ok := p.started[k]
	if !ok {
		c = make(chan struct{})
		p.started[k] = c
	}
	return c
}

// newOverlapping returns the processor of a test on e's one partition,
// whose last offset is last.
func newOverlapping(t *testing.T, e *env, last int64, nakOnce map[int64]bool) *overlapping {
	return &overlapping{t: t, last: last, nakOnce: nakOnce,
		started: map[int]chan struct{}{}, acked: map[int64]int{}, retries: map[int64]int{},
		committed: func() int64 { return e.committed()[0] }}
}

// settle waits until n offsets are committed, stops r, and reports p's
// problems. It returns holding p.mu, for the test's own checks, until the
// test ends.
func (p *overlapping) settle(t *testing.T, e *env, r *testenv.Running, n int64) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, "every offset committed", func() bool { return e.committed()[0] == n })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	t.Cleanup(p.mu.Unlock)
	for _, pr := range p.problems {
		t.Error(pr)
	}
}

func (p *overlapping) Prepare(context.Context, []consumer.Delivery) {}

func (p *overlapping) Batching() bool { return !p.single }

func (p *overlapping) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	offs := make([]int64, len(ds))
	for i, d := range ds {
		offs[i] = d.Message().Origin.Offset
	}
	p.mu.Lock()
	k := len(p.runs)
	if k > 0 {
		prev := p.runs[k-1]
		if offs[0] <= prev[len(prev)-1] {
			p.problems = append(p.problems, fmt.Sprintf("run %d %v does not follow run %d %v", k, offs, k-1, prev))
		}
	}
	if p.single && len(offs) != 1 {
		p.problems = append(p.problems, fmt.Sprintf("run %d %v of a processor that does not batch, want one delivery", k, offs))
	}
	p.runs = append(p.runs, offs)
	p.active++
	p.maxActive = max(p.maxActive, p.active)
	close(p.startedCh(k))
	next := p.startedCh(k + 1)
	p.mu.Unlock()

	if ctx.Err() == nil {
		dispatch.RunHandled(ds)
		if offs[len(offs)-1] != p.last {
			select {
			case <-next:
			case <-time.After(10 * time.Second):
				p.mu.Lock()
				p.problems = append(p.problems, fmt.Sprintf("run %d %v: the lane did not start its next run while this one stored its results", k, offs))
				p.mu.Unlock()
			}
		}
	}
	for _, d := range ds {
		off := d.Message().Origin.Offset
		switch {
		case ctx.Err() != nil:
			_ = d.Nak(ctx, 0)
		case p.nakOnce[off] && d.Attempt() == 1:
			_ = d.Nak(ctx, 0)
		default:
			p.ack(ctx, d)
		}
	}
	p.mu.Lock()
	p.active--
	p.mu.Unlock()
}

// Process takes the retries of nakked deliveries.
func (p *overlapping) Process(ctx context.Context, d consumer.Delivery) {
	if ctx.Err() != nil {
		_ = d.Nak(ctx, 0)
		return
	}
	off := d.Message().Origin.Offset
	c := p.committed()
	p.mu.Lock()
	p.retries[off] = len(p.runs)
	if c > off {
		p.problems = append(p.problems, fmt.Sprintf("offset %d committed past before its retry: committed %d", off, c))
	}
	p.mu.Unlock()
	p.ack(ctx, d)
}

func (p *overlapping) ack(ctx context.Context, d consumer.Delivery) {
	if err := d.Ack(ctx); err != nil {
		p.t.Errorf("ack of offset %d: %v", d.Message().Origin.Offset, err)
		return
	}
	p.mu.Lock()
	p.acked[d.Message().Origin.Offset]++
	p.mu.Unlock()
}

// TestLaneOverlapsStoringResults: once a run's processor reports its
// handlers done, the lane (the partition's, or under key ordering the key's)
// starts its next run while the first call is still storing its results,
// and never has more than two calls at once. A delivery nakked after the
// notice is retried in place after the run that started meanwhile and
// before any later one; the committed offset does not pass it before its
// retry is acked; every offset is acked once. A processor that does not
// batch gets runs of one delivery, and they overlap the same way.
func TestLaneOverlapsStoringResults(t *testing.T) {
	t.Parallel()
	for _, ordering := range []string{kafkasource.OrderingPartition, kafkasource.OrderingKey} {
		for _, single := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/single=%v", ordering, single), func(t *testing.T) {
				t.Parallel()
				testLaneOverlap(t, ordering, single)
			})
		}
	}
}

func testLaneOverlap(t *testing.T, ordering string, single bool) {
	const batch = 10
	n := 40
	if single {
		n = 12 // a run a delivery
	}
	e := newRealEnv(t, 1)
	var ms []msg
	for i := range n {
		// One key: under key ordering all of them are one lane.
		ms = append(ms, msg{key: "entity", value: fmt.Sprint(i)})
	}
	e.produce(e.topic, ms)
	proc := newOverlapping(t, e, int64(n-1), map[int64]bool{3: true})
	proc.single = single
	newProc := func(string, consumer.Handler) consumer.Processor { return proc }
	// Room for the next run while one stores its results.
	src := e.source(func(c *kafkasource.Config) { c.Ordering, c.BatchSize, c.MaxUnfinished = ordering, batch, 4*batch })
	r := run(t, worker(t, "overlap", src, ignore, dispatch.WithProcessor(newProc), dispatch.WithConcurrency(4)))
	proc.settle(t, e, r, int64(n))
	if proc.maxActive != 2 {
		t.Errorf("at most %d ProcessBatch calls of the lane at once, want 2: a run overlaps the storing of the one before, and no more", proc.maxActive)
	}
	if len(proc.runs) < 2 {
		t.Fatalf("%d runs, want at least 2: %v", len(proc.runs), proc.runs)
	}
	// Offset 3 was nakked by its run; it must be retried once the run
	// after it started, before a third began.
	var in int
	for k, run := range proc.runs {
		if slices.Contains(run, 3) {
			in = k
		}
	}
	if got, ok := proc.retries[3]; !ok {
		t.Error("offset 3 was nakked and never retried")
	} else if got != in+2 {
		t.Errorf("offset 3 (run %d) was retried when %d runs had started, want %d: after the overlapping run, before the next", in, got, in+2)
	}
	for off := range int64(n) {
		if proc.acked[off] != 1 {
			t.Errorf("offset %d acked %d times, want once", off, proc.acked[off])
		}
	}
	if single && len(proc.runs) != n {
		t.Errorf("%d runs of a processor that does not batch, want %d: one a delivery", len(proc.runs), n)
	}
	for off := range proc.retries {
		if off != 3 {
			t.Errorf("offset %d was retried; only offset 3 was nakked", off)
		}
	}
}

// TestLaneStartsRunQueuedWhileStoring: deliveries that reach a lane after
// its run reported its handlers done, while the run still stores its
// results, start at once, not once the run returned. (This is the steady
// rate's case: a message arrives while the last one is completed.)
func TestLaneStartsRunQueuedWhileStoring(t *testing.T) {
	t.Parallel()
	for _, ordering := range []string{kafkasource.OrderingPartition, kafkasource.OrderingKey} {
		t.Run(ordering, func(t *testing.T) {
			t.Parallel()
			const batch = 10
			e := newRealEnv(t, 1)
			produce := func(from int) {
				var ms []msg
				for i := from; i < from+batch; i++ {
					ms = append(ms, msg{key: "entity", value: fmt.Sprint(i)})
				}
				e.produce(e.topic, ms)
			}
			produce(0)
			proc := newOverlapping(t, e, 2*batch-1, nil)
			first := proc.startedCh(0)
			newProc := func(string, consumer.Handler) consumer.Processor { return proc }
			src := e.source(func(c *kafkasource.Config) { c.Ordering, c.BatchSize = ordering, batch })
			r := run(t, worker(t, "queued", src, ignore, dispatch.WithProcessor(newProc), dispatch.WithConcurrency(4)))
			select {
			case <-first:
			case <-time.After(30 * time.Second):
				t.Fatal("the first run did not start")
			}
			// Run 0 is now held in ProcessBatch after its notice, until
			// run 1 starts: run 1's messages are not produced yet.
			produce(batch)
			proc.settle(t, e, r, 2*batch)
			if len(proc.runs) < 2 || proc.maxActive != 2 {
				t.Errorf("runs %v, at most %d at once; want a run started while the one before stored its results, and no more", proc.runs, proc.maxActive)
			}
			for off := range int64(2 * batch) {
				if proc.acked[off] != 1 {
					t.Errorf("offset %d acked %d times, want once", off, proc.acked[off])
				}
			}
		})
	}
}
