package natssource_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// publishSized publishes n messages "<i>" padded to size bytes, each with
// an Idempotency-Key header, and waits for their stream acks.
func (e *env) publishSized(t *testing.T, n, size int) {
	t.Helper()
	e.publishEach(t, 60*time.Second, n, func(i int) *nats.Msg {
		m := nats.NewMsg(e.subj + ".big")
		m.Data = make([]byte, size)
		copy(m.Data, fmt.Sprintf("%d ", i))
		m.Header.Set("Idempotency-Key", fmt.Sprintf("k%d", i))
		return m
	})
}

// inCalls counts the messages in handler calls, the most at once, and
// every message handled, and holds every call until release is closed.
type inCalls struct {
	release chan struct{}
	once    sync.Once

	mu      sync.Mutex
	now     int
	peak    int
	handled map[string]int
}

// newInCalls returns calls held until releaseAll, which the test's cleanup
// calls too, so that a failed test does not leave them stuck.
func newInCalls(t *testing.T) *inCalls {
	c := &inCalls{release: make(chan struct{}), handled: map[string]int{}}
	t.Cleanup(c.releaseAll)
	return c
}

func (c *inCalls) releaseAll() { c.once.Do(func() { close(c.release) }) }

func (c *inCalls) enter(msgs ...*consumer.Message) {
	c.mu.Lock()
	c.now += len(msgs)
	c.peak = max(c.peak, c.now)
	for _, m := range msgs {
		var i int
		fmt.Sscanf(string(m.Payload), "%d ", &i)
		c.handled[fmt.Sprint(i)]++
	}
	c.mu.Unlock()
	<-c.release
	c.mu.Lock()
	c.now -= len(msgs)
	c.mu.Unlock()
}

func (c *inCalls) state() (now, peak, distinct int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now, c.peak, len(c.handled)
}

// TestFetchBufferBoundsReceivedBytes: with messages of 64 KiB and a bound
// of 1 MiB, the messages in handler calls stay within the bound, and the
// messages the server has handed out unacknowledged within the bound plus
// the client's pull buffer of about two pull requests' bytes, far fewer
// than the handler's concurrency (one delivery a slot) or its MaxAckPending
// (a batch handler) would let through. Once the calls return every message
// is handled once and nothing stays held.
func TestFetchBufferBoundsReceivedBytes(t *testing.T) {
	const (
		n     = 150
		size  = 64 << 10
		bound = 1 << 20
	)
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%t", batching), func(t *testing.T) {
			forEachServer(t, func(t *testing.T, e *env) {
				e.publishSized(t, n, size)
				calls := newInCalls(t)
				var h consumer.Handler = consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) ([]byte, error) {
					calls.enter(m)
					return nil, nil
				})
				cfg := natssource.Config{AckWait: 30 * time.Second, FetchBufferBytes: bound}
				conc := 64
				if batching {
					h = consumer.BatchFunc(func(_ context.Context, msgs []*consumer.Message, _ []consumer.Result) {
						calls.enter(msgs...)
					})
					// Without the bound's bytes the subscription would
					// ask for 8 runs of 64 ahead, every message here.
					conc, cfg.Batch, cfg.MaxAckPending = 2, 64, 1000
				}
				src := newSource(t, e, cfg)
				r := run(t, dispatch.Config{}, src, h, dispatch.WithConcurrency(conc))

				// The bound fills and the callback waits for room.
				// The bound fills, the callback waits for room, and what
				// the bound holds reaches the handler.
				testenv.EventuallyNil(t, 30*time.Second, "the bound full, the callback waiting, messages in calls", func() error {
					now, _, _ := calls.state()
					if st := src.FetchBufferStats(); st.Waited <= 0 || now == 0 {
						return fmt.Errorf("%d messages in calls, %+v", now, st)
					}
					return nil
				})
				perMsg := size + 256 // a message's cost is its payload and a few hundred bytes
				pullBytes := int(e.nc.MaxPayload()) + 8<<10
				inBound := bound/size + 1
				now, peak, _ := calls.state()
				if peak > inBound {
					t.Errorf("%d messages were in calls at once, want at most %d: the bound is %d bytes and a message costs more than %d", peak, inBound, bound, size)
				}
				st := src.FetchBufferStats()
				if st.Size != bound || st.Held > bound || st.Held < int64(now*perMsg) {
					t.Errorf("FetchBufferStats = %+v with %d messages in calls, want size %d and held between %d and the size", st, now, bound, now*perMsg)
				}
				// Unacknowledged on the server: the bound's, the one
				// message the callback waits with, and the pull buffer's.
				maxOut := inBound + 1 + 2*(pullBytes/size+1)
				out := e.consumerInfo(t, "c").NumAckPending
				t.Logf("%d messages in calls at most, %d unacknowledged on the server (at most %d and %d allowed)", peak, out, inBound, maxOut)
				if out > maxOut {
					t.Errorf("the server has %d messages unacknowledged, want at most %d: the pull requests are not bounded in bytes", out, maxOut)
				}

				calls.releaseAll()
				e.drained(t, "c", 60*time.Second)
				if st := src.FetchBufferStats(); st.Held != 0 {
					t.Errorf("FetchBufferStats = %+v with every message acked, want nothing held", st)
				}
				if err := r.Stop(t, 30*time.Second); err != nil {
					t.Errorf("worker: %v", err)
				}
				_, _, distinct := calls.state()
				calls.mu.Lock()
				defer calls.mu.Unlock()
				if distinct != n {
					t.Errorf("%d distinct messages handled, want %d", distinct, n)
				}
				for k, runs := range calls.handled {
					if runs != 1 {
						t.Errorf("message %s handled %d times, want once", k, runs)
					}
				}
			})
		})
	}
}

// TestFetchBufferTakesALargerMessageAlone: a message larger than the whole
// bound is not stuck: it is taken once nothing else is held, alone.
func TestFetchBufferTakesALargerMessageAlone(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n = 12
		e.publishSized(t, n, 100<<10)
		calls := newInCalls(t)
		calls.releaseAll()
		h := consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) ([]byte, error) {
			calls.enter(m)
			return nil, nil
		})
		src := newSource(t, e, natssource.Config{AckWait: 30 * time.Second, FetchBufferBytes: 64 << 10})
		run(t, dispatch.Config{}, src, h, dispatch.WithConcurrency(8))
		e.drained(t, "c", 60*time.Second)
		if _, peak, distinct := calls.state(); distinct != n || peak != 1 {
			t.Errorf("%d distinct messages handled, at most %d at once; want %d, one at a time", distinct, peak, n)
		}
	})
}
