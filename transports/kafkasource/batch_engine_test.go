package kafkasource_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// runKey is the context key of a lane run's number (runCounter).
type runKey struct{}

// runCounter is a consumer.Processor that numbers the lane runs it is
// handed, in the context they run with, so that a batch handler can tell
// which run each of its calls belongs to.
type runCounter struct {
	consumer.Processor
	runs atomic.Int64
}

func (r *runCounter) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	r.Processor.ProcessBatch(context.WithValue(ctx, runKey{}, r.runs.Add(1)), ds)
}

// TestBatchRunWithProducerRetriesIsOneCall: on real Kafka and Redis, with
// the deduplication engine in front of a batch handler, a backlog in which
// every fifth message is followed by a producer retry of it (same
// Idempotency-Key and payload, the next offset). Each retry lands in the
// run of its original, or in the next run while its original may still be
// in flight when the next fetch is claimed. Either way it is a duplicate
// that must not split its run: every lane run makes at most one handler
// call (one produce call for a forward action), every key is handled
// once, in offset order, and the committed offset reaches the end.
func TestBatchRunWithProducerRetriesIsOneCall(t *testing.T) {
	t.Parallel()
	e := newRealEnv(t, 1)
	var msgs []msg
	retries := 0
	for i := range 60 {
		m := msg{value: fmt.Sprintf(`{"n":%d}`, i), headers: hdrs("Idempotency-Key", fmt.Sprintf("k%d", i))}
		msgs = append(msgs, m)
		if i%5 == 2 {
			msgs = append(msgs, m)
			retries++
		}
	}
	e.produce(e.topic, msgs)

	dedup := engineProcessor(t, e.topic, idempotency.WithRetention(time.Minute))
	counter := &runCounter{}
	factory := func(name string, h consumer.Handler) consumer.Processor {
		counter.Processor = dedup(name, h)
		return counter
	}

	var mu sync.Mutex
	callsPerRun := map[int64]int{}
	var handled []string
	var problems []string
	h := consumer.BatchFunc(func(ctx context.Context, ms []*consumer.Message, results []consumer.Result) {
		mu.Lock()
		defer mu.Unlock()
		run, ok := ctx.Value(runKey{}).(int64)
		if !ok {
			problems = append(problems, "a handler call outside a lane run")
		}
		callsPerRun[run]++
		for _, m := range ms {
			handled = append(handled, m.Header.Get("Idempotency-Key"))
		}
	})
	src := e.source(func(c *kafkasource.Config) { c.BatchSize = 10 })
	r := run(t, worker(t, "retries", src, h, dispatch.WithProcessor(factory), dispatch.WithConcurrency(4)))
	ends := map[int]int64{0: int64(len(msgs))}
	testenv.Eventually(t, 60*time.Second, "committed offset at the partition end", func() bool { return reachedEnds(e.committed(), ends) })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	for run, n := range callsPerRun {
		if n > 1 {
			t.Errorf("lane run %d made %d handler calls: a producer retry in a run must not split it", run, n)
		}
	}
	if len(handled) != 60 {
		t.Errorf("%d messages handled, want 60 (%d retries never handled): %v", len(handled), retries, handled)
	}
	for i, k := range handled {
		if want := fmt.Sprintf("k%d", i); k != want {
			t.Fatalf("handled %v: message %d is %s, want %s (each key once, in offset order)", handled, i, k, want)
		}
	}
}
