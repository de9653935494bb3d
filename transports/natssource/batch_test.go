package natssource_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// TestBatchHandlerGetsFetches: a batch handler gets each fetched batch in
// one call, within the concurrency; every message is handled once, a failed
// one alone is redelivered, and the consumer ends with nothing pending.
func TestBatchHandlerGetsFetches(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n, conc = 300, 8
		e.publish(t, n)
		var (
			mu       sync.Mutex
			handled  = map[string][]int{} // payload → attempts seen
			maxCall  int
			inFlight int
			peak     int
		)
		h := consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
			mu.Lock()
			inFlight += len(msgs)
			peak = max(peak, inFlight)
			maxCall = max(maxCall, len(msgs))
			for i, m := range msgs {
				p := string(m.Payload)
				handled[p] = append(handled[p], len(handled[p])+1)
				if p == "m7" && len(handled[p]) == 1 {
					results[i].Err = consumer.RetryAfter(50 * time.Millisecond)
				}
			}
			mu.Unlock()
			// Let fetches queue behind this call, so later ones grow.
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			inFlight -= len(msgs)
			mu.Unlock()
		})
		src := newSource(t, e, natssource.Config{AckWait: 5 * time.Second})
		run(t, consumer.Config{}, src, h, consumer.WithConcurrency(conc))
		done := func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(handled) == n && len(handled["m7"]) == 2
		}
		testenv.EventuallyNil(t, 30*time.Second, "every message handled, m7 twice", func() error {
			if done() {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			return fmt.Errorf("%d of %d handled, m7 %v", len(handled), n, handled["m7"])
		})
		e.drained(t, "c", 10*time.Second)
		mu.Lock()
		defer mu.Unlock()
		for p, runs := range handled {
			if want := 1 + btoi(p == "m7"); len(runs) != want {
				t.Errorf("%s handled %d times, want %d", p, len(runs), want)
			}
		}
		if maxCall < 2 {
			t.Errorf("largest call %d messages: fetched batches must reach the handler together", maxCall)
		}
		if peak > conc {
			t.Errorf("%d messages in calls at once, over concurrency %d", peak, conc)
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
