package kafkasource_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// preparing is a Processor with a Prepare recording what the source does;
// it takes runs one delivery at a time.
type preparing struct {
	mu        sync.Mutex
	batches   [][]int64
	processed map[consumer.Delivery]int
	prepared  map[consumer.Delivery]bool
	causes    map[int64]error
	block     chan struct{} // offset 0 waits for it
	started   chan struct{}
}

func (p *preparing) Prepare(_ context.Context, batch []consumer.Delivery) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var offs []int64
	for _, d := range batch {
		p.prepared[d] = true
		offs = append(offs, d.Message().Origin.Offset)
	}
	p.batches = append(p.batches, offs)
}

func (p *preparing) Process(ctx context.Context, d consumer.Delivery) {
	off := d.Message().Origin.Offset
	p.mu.Lock()
	p.processed[d]++
	if ctx.Err() != nil {
		p.causes[off] = context.Cause(ctx)
	}
	p.mu.Unlock()
	if ctx.Err() != nil {
		_ = d.Nak(ctx, 0)
		return
	}
	if off == 0 {
		close(p.started)
		<-p.block
	}
	_ = d.Ack(ctx)
}

func (p *preparing) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	for _, d := range ds {
		p.Process(ctx, d)
	}
}

func (p *preparing) Batching() bool { return false }

// TestPreparedAlwaysProcessed checks the consumer.Processor.Prepare contract on
// stop: every prepared delivery is processed exactly once; those that had
// not started get a cancelled context with cause ErrStopping and stay
// uncommitted; batches respect BatchSize and fetching pauses at
// MaxUnfinished.
func TestPreparedAlwaysProcessed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	var ms []msg
	for range 30 {
		ms = append(ms, msg{value: "x"})
	}
	e.produce(e.topic, ms)
	proc := &preparing{processed: map[consumer.Delivery]int{}, prepared: map[consumer.Delivery]bool{},
		causes: map[int64]error{}, block: make(chan struct{}), started: make(chan struct{})}
	newProc := func(string, consumer.Handler) consumer.Processor { return proc }
	src := e.source(func(c *kafkasource.Config) { c.BatchSize, c.MaxUnfinished = 10, 10 })
	r := run(t, worker(t, "prep", src, consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil }), dispatch.WithProcessor(newProc)))
	select {
	case <-proc.started:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	r.Cancel()
	time.AfterFunc(100*time.Millisecond, func() { close(proc.block) })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if len(proc.batches) != 1 || len(proc.batches[0]) != 10 {
		t.Errorf("prepared batches %v, want one of 10 (BatchSize 10; fetching pauses while MaxUnfinished 10 are unfinished)", proc.batches)
	}
	for d := range proc.prepared {
		if n := proc.processed[d]; n != 1 {
			t.Errorf("prepared delivery at offset %d processed %d times, want exactly once", d.Message().Origin.Offset, n)
		}
	}
	for off := int64(1); off < 10; off++ {
		if c := proc.causes[off]; !errors.Is(c, kafkasource.ErrStopping) {
			t.Errorf("offset %d: cancelled with cause %v, want ErrStopping", off, c)
		}
	}
	if c := e.committed()[0]; c != 1 {
		t.Errorf("committed %d, want 1: only the in-flight delivery finished", c)
	}
}

// TestStopDuringRetryWait: a delivery waiting to be retried in place does
// not hold up shutdown, and it stays uncommitted.
func TestStopDuringRetryWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(e.topic, []msg{{value: "fails"}})
	failed := make(chan struct{}, 1)
	h := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) {
		select {
		case failed <- struct{}{}:
		default:
		}
		return nil, dispatch.RetryAfter(time.Hour, nil)
	})
	r := run(t, worker(t, "wait", e.source(nil), h))
	select {
	case <-failed:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	start := time.Now()
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stop took %v while a retry waited an hour", d)
	}
	if c := e.committed()[0]; c > 0 {
		t.Errorf("committed %d past the unfinished message", c)
	}
}
