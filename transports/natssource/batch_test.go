package natssource_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// TestBatchHandlerGetsFetches: a batch handler gets each fetched batch in
// one call, at most the concurrency's calls at once; every message is handled
// once, a failed one alone is redelivered, and the consumer ends with nothing
// pending.
func TestBatchHandlerGetsFetches(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n, conc = 300, 8
		e.publish(t, n)
		var (
			mu       sync.Mutex
			handled  = map[string][]int{} // payload → attempts seen
			maxCall  int
			inFlight int // messages in calls
			peak     int
			calls    int // calls running
			peakCall int
		)
		h := consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
			mu.Lock()
			inFlight += len(msgs)
			peak = max(peak, inFlight)
			calls++
			peakCall = max(peakCall, calls)
			maxCall = max(maxCall, len(msgs))
			for i, m := range msgs {
				p := string(m.Payload)
				handled[p] = append(handled[p], len(handled[p])+1)
				if p == "m7" && len(handled[p]) == 1 {
					results[i].Err = dispatch.RetryAfter(50*time.Millisecond, nil)
				}
			}
			mu.Unlock()
			// Let fetches queue behind this call, so later ones grow.
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			inFlight -= len(msgs)
			calls--
			mu.Unlock()
		})
		src := newSource(t, e, natssource.Config{AckWait: 5 * time.Second})
		run(t, dispatch.Config{}, src, h, dispatch.WithConcurrency(conc))
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
		if peakCall > conc {
			t.Errorf("%d calls at once, over concurrency %d", peakCall, conc)
		}
		if peak > conc*defaultRunBatch {
			t.Errorf("%d messages in calls at once, over concurrency × batch %d", peak, conc*defaultRunBatch)
		}
	})
}

// defaultRunBatch is a batch handler's run by default when the concurrency
// is under it (natssource's unexported constant of the name).
const defaultRunBatch = 128

// TestBatchRunDefaultsToMoreThanConcurrency: with Config.Batch unset, a
// batch handler's runs may hold more messages than its concurrency, up to
// 128, and the consumer the Source creates lets that many be unacknowledged.
// A run holds one slot whatever its size; a run of one message each, as
// concurrency 1 would give, costs a claim call and a completion call a
// message.
func TestBatchRunDefaultsToMoreThanConcurrency(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n = 300
		e.publish(t, n)
		var (
			mu      sync.Mutex
			handled = map[string]int{}
			sizes   []int
		)
		release := make(chan struct{})
		h := consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
			mu.Lock()
			first := len(sizes) == 0
			sizes = append(sizes, len(msgs))
			for _, m := range msgs {
				handled[string(m.Payload)]++
			}
			mu.Unlock()
			if first {
				// Hold the one slot until the server delivered all it may,
				// so that the next run finds them received.
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
		})
		src := newSource(t, e, natssource.Config{AckWait: 10 * time.Second})
		run(t, dispatch.Config{}, src, h, dispatch.WithConcurrency(1))
		testenv.EventuallyNil(t, 10*time.Second, "the server delivers a default run's window while the first run blocks", func() error {
			ctx := ctxT(t, 5*time.Second)
			c, err := e.js.Consumer(ctx, e.stream, "c")
			if err != nil { // not created yet
				return err
			}
			info, err := c.Info(ctx)
			if err != nil {
				return err
			}
			if info.NumAckPending < defaultRunBatch {
				return fmt.Errorf("%d messages delivered and unacknowledged, want %d", info.NumAckPending, defaultRunBatch)
			}
			return nil
		})
		if got := e.consumerInfo(t, "c").Config.MaxAckPending; got != defaultRunBatch {
			t.Errorf("created consumer's MaxAckPending %d, want %d (concurrency 1 × a default run)", got, defaultRunBatch)
		}
		close(release)
		allHandledOnce(t, e, &mu, handled, n)
		mu.Lock()
		defer mu.Unlock()
		if largest := slices.Max(sizes); largest < 2 || largest > defaultRunBatch {
			t.Errorf("runs of %v messages: want one of more than the concurrency (1), none over %d", sizes, defaultRunBatch)
		}
	})
}

// TestBatchRunHoldsOneSlot: a batch handler's call holds one of the
// concurrency's slots however many messages it carries (consumer.Runner's
// ProcessBatch contract), so with every call blocked more than concurrency
// messages are in calls, never more than concurrency calls, and none is
// acked before its own call returned. The consumer the Source creates has
// MaxAckPending concurrency × Batch, so that window is usable.
func TestBatchRunHoldsOneSlot(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n, conc, batch = 60, 2, 10
		e.publish(t, n)
		var (
			mu       sync.Mutex
			handled  = map[string]int{}
			inFlight int // messages in calls
			peak     int
			calls    int
			peakCall int
		)
		release := make(chan struct{})
		h := consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
			mu.Lock()
			inFlight += len(msgs)
			peak = max(peak, inFlight)
			calls++
			peakCall = max(peakCall, calls)
			mu.Unlock()
			select {
			case <-release:
			case <-ctx.Done():
			}
			mu.Lock()
			for _, m := range msgs {
				handled[string(m.Payload)]++
			}
			inFlight -= len(msgs)
			calls--
			mu.Unlock()
		})
		src := newSource(t, e, natssource.Config{AckWait: 10 * time.Second, Batch: batch})
		run(t, dispatch.Config{}, src, h, dispatch.WithConcurrency(conc))
		testenv.EventuallyNil(t, 10*time.Second, "more than concurrency messages in blocked calls", func() error {
			mu.Lock()
			defer mu.Unlock()
			if calls == conc && inFlight > conc {
				return nil
			}
			return fmt.Errorf("%d calls with %d messages", calls, inFlight)
		})
		info := e.consumerInfo(t, "c")
		if got := info.Config.MaxAckPending; got != conc*batch {
			t.Errorf("created consumer's MaxAckPending %d, want concurrency × batch %d", got, conc*batch)
		}
		mu.Lock()
		blocked := inFlight
		mu.Unlock()
		if info.AckFloor.Stream != 0 || info.NumAckPending < blocked {
			t.Errorf("while every call blocks: ack floor %d, ack pending %d, want nothing acked and at least the %d messages in calls pending",
				info.AckFloor.Stream, info.NumAckPending, blocked)
		}
		close(release)
		allHandledOnce(t, e, &mu, handled, n)
		mu.Lock()
		defer mu.Unlock()
		if peakCall > conc {
			t.Errorf("%d calls at once, over concurrency %d", peakCall, conc)
		}
		if peak > conc*batch {
			t.Errorf("%d messages in calls at once, over concurrency × batch %d", peak, conc*batch)
		}
	})
}

// allHandledOnce waits until handled, guarded by mu, holds n payloads and
// consumer c has settled everything, then checks that each payload was
// handled once.
func allHandledOnce(t *testing.T, e *env, mu *sync.Mutex, handled map[string]int, n int) {
	t.Helper()
	testenv.EventuallyNil(t, 30*time.Second, "every message handled", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(handled) == n {
			return nil
		}
		return fmt.Errorf("%d of %d handled", len(handled), n)
	})
	e.drained(t, "c", 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	for p, k := range handled {
		if k != 1 {
			t.Errorf("%s handled %d times, want once", p, k)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestBatchExistingConsumerRaised: a durable that exists with
// the concurrency as its MaxAckPending is raised to a batching runner's
// window, concurrency × Batch, with the Info line naming old and new values;
// an explicit MaxAckPending still wins over that default.
func TestBatchExistingConsumerRaised(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const conc, batch = 4, 8
		ctx := ctxT(t, 5*time.Second)
		if _, err := e.js.CreateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
			Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxAckPending: conc,
		}); err != nil {
			t.Fatal(err)
		}
		e.publish(t, 3)
		idle := consumer.BatchFunc(func(context.Context, []*consumer.Message, []consumer.Result) {})
		logs := &testenv.SyncBuffer{}
		src := newSource(t, e, natssource.Config{AckWait: 5 * time.Second, Batch: batch, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		r := run(t, dispatch.Config{}, src, idle, dispatch.WithConcurrency(conc))
		e.drained(t, "c", 10*time.Second)
		if got := e.consumerInfo(t, "c").Config.MaxAckPending; got != conc*batch {
			t.Errorf("existing consumer's MaxAckPending %d, want concurrency × batch %d", got, conc*batch)
		}
		for _, want := range []string{`level=INFO msg="updated the existing consumer to follow the configuration"`, fmt.Sprintf("old_max_ack_pending=%d max_ack_pending=%d", conc, conc*batch)} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("logs lack %s:\n%s", want, logs)
			}
		}
		if err := r.Stop(t, 10*time.Second); err != nil {
			t.Fatalf("stopping the first worker: %v", err)
		}

		// Explicit wins: a second durable, created with Config.MaxAckPending.
		src = newSource(t, e, natssource.Config{Consumer: "explicit", AckWait: 5 * time.Second, Batch: batch, MaxAckPending: 6})
		run(t, dispatch.Config{}, src, idle, dispatch.WithConcurrency(conc))
		e.drained(t, "explicit", 10*time.Second)
		if got := e.consumerInfo(t, "explicit").Config.MaxAckPending; got != 6 {
			t.Errorf("explicit MaxAckPending: got %d, want 6", got)
		}
	})
}
