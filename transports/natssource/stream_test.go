package natssource_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// createWideConsumer creates the durable consumer "c" with a MaxAckPending
// far above the handler's concurrency, as for several workers sharing it:
// the server then does not bound what it pushes, only the Source does.
func createWideConsumer(t *testing.T, e *env, ackWait time.Duration) {
	t.Helper()
	_, err := e.js.CreateConsumer(ctxT(t, 5*time.Second), e.stream, jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: 1000, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ackPending is the consumer's NumAckPending: messages the server has
// pushed and that are neither acked nor nakked.
func (e *env) ackPending(t *testing.T) int {
	t.Helper()
	return e.consumerInfo(t, "c").NumAckPending
}

// never polls cond every 20ms for d and fails if it holds once.
func never(t *testing.T, d time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			t.Fatal(msg())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStreamBoundedByConcurrency: with a consumer whose MaxAckPending does
// not bound the server, the Source still runs at most Concurrency handlers
// at once, prepares batches no larger than that, and holds a bounded number
// of messages in the client while every slot is busy (a Source that let the
// server push freely would hold all 50). Every message is handled once.
func TestStreamBoundedByConcurrency(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n, limit = 50, 4
		// Subscription ahead (limit) + handed on (limit) + in the handlers.
		const maxHeld = 3 * limit
		createWideConsumer(t, e, 30*time.Second)
		e.publish(t, n)
		var active, peak, done atomic.Int32
		var batchMu sync.Mutex
		var bigBatch int
		gate := make(chan struct{})
		proc := func(_ string, h consumer.Handler) consumer.Processor {
			return preparer{
				prepare: func(batch []consumer.Delivery) {
					batchMu.Lock()
					bigBatch = max(bigBatch, len(batch))
					batchMu.Unlock()
				},
				process: func(ctx context.Context, d consumer.Delivery) {
					a := active.Add(1)
					for {
						p := peak.Load()
						if a <= p || peak.CompareAndSwap(p, a) {
							break
						}
					}
					<-gate
					active.Add(-1)
					done.Add(1)
					_ = d.Ack(ctx)
				},
			}
		}
		run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), consumer.HandlerFunc(nil), dispatch.WithConcurrency(limit), dispatch.WithProcessor(proc))
		var open sync.Once
		openGate := func() { open.Do(func() { close(gate) }) }
		t.Cleanup(openGate) // before the worker's stop, also when the test fails
		// Every slot busy, and the client's buffer filled as far as it goes.
		testenv.EventuallyNil(t, 10*time.Second, "the limit active and more held", func() error {
			if a, p := active.Load(), e.ackPending(t); a != limit || p <= 2*limit {
				return fmt.Errorf("%d active, %d ack pending", a, p)
			}
			return nil
		})
		// It stays bounded across pull renewals (the pull expiry is 1s).
		never(t, 2500*time.Millisecond, func() bool { return e.ackPending(t) > maxHeld || active.Load() > limit },
			func() string {
				return fmt.Sprintf("%d ack pending (at most %d expected), %d active", e.ackPending(t), maxHeld, active.Load())
			})
		openGate()
		testenv.EventuallyNil(t, 20*time.Second, "every message done", func() error {
			if d := done.Load(); d != n {
				return fmt.Errorf("%d of %d done", d, n)
			}
			return nil
		})
		e.drained(t, "c", 10*time.Second)
		if p := peak.Load(); p != limit {
			t.Errorf("peak concurrency %d, want exactly %d", p, limit)
		}
		batchMu.Lock()
		defer batchMu.Unlock()
		if bigBatch > limit {
			t.Errorf("a batch of %d with concurrency %d", bigBatch, limit)
		}
	})
}

// preparer is a Processor with a Prepare, taking runs one delivery at a
// time.
type preparer struct {
	prepare func(batch []consumer.Delivery)
	process func(ctx context.Context, d consumer.Delivery)
}

func (p preparer) Prepare(_ context.Context, batch []consumer.Delivery) { p.prepare(batch) }
func (p preparer) Process(ctx context.Context, d consumer.Delivery)     { p.process(ctx, d) }
func (p preparer) Batching() bool                                       { return false }

func (p preparer) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	for _, d := range ds {
		p.process(ctx, d)
	}
}

// TestStopNaksBuffered: stopping while messages wait in the client's buffer
// naks them, so a second Consume gets them at once, not after AckWait (30s
// here; a nakked message still counts in NumAckPending until the server
// redelivers it, so only the redelivery tells); messages
// published after the stop are not swallowed by a pull request left behind.
// Every message is handled exactly once to completion.
func TestStopNaksBuffered(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n, later, limit = 50, 10, 4
		createWideConsumer(t, e, 30*time.Second)
		e.publish(t, n)
		s := newSeen()
		started := make(chan struct{}, n)
		release := make(chan struct{})
		h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			started <- struct{}{}
			<-release
			s.add(string(m.Payload), 0)
			return nil, nil
		})
		r := run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), h, dispatch.WithConcurrency(limit))
		var open sync.Once
		releaseAll := func() { open.Do(func() { close(release) }) }
		t.Cleanup(releaseAll)
		for range limit {
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("handlers did not start")
			}
		}
		// Messages are waiting in the client, beyond those being handled.
		testenv.EventuallyNil(t, 10*time.Second, fmt.Sprintf("more than %d ack pending", limit), func() error {
			if p := e.ackPending(t); p <= limit {
				return fmt.Errorf("%d ack pending", p)
			}
			return nil
		})
		r.Cancel()
		releaseAll()
		if err := r.Wait(t, 10*time.Second); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		if got := len(started); got != 0 {
			t.Errorf("%d handlers started after the first %d", got, limit)
		}
		if got := s.count(); got != limit {
			t.Errorf("first worker completed %d, want %d", got, limit)
		}
		e.publish(t, later) // m0..m9 again, with their keys: payloads repeat
		h2 := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			s.add(string(m.Payload), 0)
			return nil, nil
		})
		run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), h2, dispatch.WithConcurrency(limit))
		testenv.EventuallyNil(t, 10*time.Second, "the nakked messages redelivered promptly", func() error {
			if c := s.count(); c < n+later {
				return fmt.Errorf("%d of %d handled", c, n+later)
			}
			return nil
		})
		e.drained(t, "c", 10*time.Second)
		for i := range n {
			want := 1
			if i < later {
				want = 2 // published twice
			}
			if got := len(s.get(fmt.Sprintf("m%d", i))); got != want {
				t.Errorf("m%d handled %d times, want %d", i, got, want)
			}
		}
	})
}

// TestLoneMessageNotHeldBack: on an idle stream a message is handled long
// before a pull request expires: the Source neither waits to fill a batch
// nor for a fetch round to end.
func TestLoneMessageNotHeldBack(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		got := make(chan time.Time, 4)
		h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			got <- time.Now()
			return nil, nil
		})
		run(t, dispatch.Config{}, newSource(t, e, natssource.Config{FetchMaxWait: 5 * time.Second}), h, dispatch.WithConcurrency(64))
		e.drained(t, "c", 10*time.Second) // bound, its pull request waiting
		for i := range 3 {
			at := time.Now()
			e.publish(t, 1)
			select {
			case t1 := <-got:
				if d := t1.Sub(at); d > 2*time.Second {
					t.Errorf("message %d handled %s after its publish", i, d)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("message %d not handled", i)
			}
		}
	})
}
