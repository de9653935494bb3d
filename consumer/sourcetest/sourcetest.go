package sourcetest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// Env is one check's transport: a topic or stream of its own, read by one
// group or durable, with a dead-letter destination the check can read.
type Env struct {
	// Transport is what Origin.Transport of every delivery must say
	// ("kafka", "nats").
	Transport string
	// NewSource returns a new Source on the Env's topic or stream and its
	// one group or durable, with the dead-letter destination configured:
	// each call is what a restarted worker gets.
	NewSource func(t *testing.T) consumer.Source
	// Publish puts msgs on the topic or stream, in order, and returns when
	// the broker has them.
	Publish func(t *testing.T, msgs ...Msg)
	// DeadLetters returns every message dead-lettered so far, in order.
	DeadLetters func(t *testing.T) []*consumer.Message
	// AckWait is how long the broker waits for a delivery to be settled
	// before it delivers it again (NATS AckWait); zero for a transport that
	// never redelivers on a timer (Kafka).
	AckWait time.Duration
}

// Msg is a message to publish.
type Msg struct {
	Payload string
	Header  consumer.Header
}

// Run runs every check against Envs made by newEnv, one per check, in
// parallel.
func Run(t *testing.T, newEnv func(t *testing.T) *Env) {
	checks := []struct {
		name string
		run  func(t *testing.T, e *Env)
	}{
		{"AckedOnce", testAckedOnce},
		{"NakRedelivers", testNakRedelivers},
		{"AttemptsCount", testAttemptsCount},
		{"DeadLetter", testDeadLetter},
		{"HeartbeatHolds", testHeartbeatHolds},
		{"StopDrains", testStopDrains},
		{"PreparedProcessedOnce", testPreparedProcessedOnce},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newEnv(t))
		})
	}
}

// wait bounds every wait of the suite for something the broker must do.
const wait = 30 * time.Second

// seen is one call of the processor: a delivery and what it carried then.
type seen struct {
	d       consumer.Delivery
	payload string
	attempt int
	at      time.Time
}

// runner is the consumer.Runner of a check: it records every delivery and
// settles it with the check's settle function.
type runner struct {
	t      *testing.T
	settle func(ctx context.Context, d consumer.Delivery)

	mu       sync.Mutex
	seen     []seen
	prepared map[consumer.Delivery]int
	process  map[consumer.Delivery]int
	changed  chan struct{} // closed and replaced on every Process call
}

func newRunner(t *testing.T, settle func(ctx context.Context, d consumer.Delivery)) *runner {
	return &runner{
		t: t, settle: settle,
		prepared: map[consumer.Delivery]int{}, process: map[consumer.Delivery]int{},
		changed: make(chan struct{}),
	}
}

func (r *runner) Name() string     { return "sourcetest" }
func (r *runner) Concurrency() int { return 4 }

func (r *runner) Prepare(_ context.Context, batch []consumer.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range batch {
		r.prepared[d]++
	}
}

func (r *runner) Process(ctx context.Context, d consumer.Delivery) {
	m := d.Message()
	r.mu.Lock()
	r.seen = append(r.seen, seen{d: d, payload: string(m.Payload), attempt: d.Attempt(), at: time.Now()})
	r.process[d]++
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	r.settle(ctx, d)
}

// ProcessBatch runs each delivery of ds in order, as a processor that does
// not take batches is run.
func (r *runner) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	for _, d := range ds {
		r.Process(ctx, d)
	}
}

// Batching is false: the checks see one delivery per Process call.
func (r *runner) Batching() bool { return false }

// await waits until cond holds over what was seen.
func (r *runner) await(what string, cond func(s []seen) bool) []seen {
	r.t.Helper()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		s := slices.Clone(r.seen)
		ch := r.changed
		r.mu.Unlock()
		if cond(s) {
			return s
		}
		select {
		case <-ch:
		case <-deadline.C:
			r.t.Fatalf("sourcetest: not within %s: %s (seen %s)", wait, what, describe(s))
		}
	}
}

func describe(s []seen) string {
	out := "["
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x.payload + "#" + strconv.Itoa(x.attempt)
	}
	return out + "]"
}

func payloads(s []seen) []string {
	var p []string
	for _, x := range s {
		p = append(p, x.payload)
	}
	return p
}

// consuming is a Source's Consume running in the background.
type consuming struct {
	cancel context.CancelFunc
	done   chan error
}

func consume(t *testing.T, src consumer.Source, r *runner) *consuming {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &consuming{cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- src.Consume(ctx, r) }()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// stop cancels Consume and waits for it; it fails the test when Consume
// returns an error or does not return.
func (c *consuming) stop(t *testing.T) {
	t.Helper()
	c.cancel()
	select {
	case err, ok := <-c.done:
		if ok && err != nil {
			t.Errorf("sourcetest: Consume returned %v after cancellation, want nil", err)
		}
		if ok {
			close(c.done)
		}
	case <-time.After(wait):
		t.Fatalf("sourcetest: Consume did not return within %s of its cancellation", wait)
	}
}

func ack(ctx context.Context, d consumer.Delivery) { _ = d.Ack(ctx) }

// onlyMarker restarts the Env's subscription, publishes a marker and waits
// for it: a delivery the first Source settled must not come again before it.
func onlyMarker(t *testing.T, e *Env, why string) {
	t.Helper()
	r := newRunner(t, ack)
	consume(t, e.NewSource(t), r)
	e.Publish(t, Msg{Payload: "marker"})
	s := r.await("the marker after a restart", func(s []seen) bool { return slices.Contains(payloads(s), "marker") })
	for _, x := range s {
		if x.payload != "marker" {
			t.Errorf("sourcetest: %q delivered again after a restart: %s", x.payload, why)
		}
	}
}

func messages(n int) []Msg {
	ms := make([]Msg, n)
	for i := range ms {
		ms[i] = Msg{Payload: "m" + strconv.Itoa(i), Header: consumer.Header{"Idempotency-Key": {"k" + strconv.Itoa(i)}, "X-Test": {"v" + strconv.Itoa(i)}}}
	}
	return ms
}

// Acked deliveries come once, with their payload, headers, origin and
// attempt 1, and not again after a restart.
func testAckedOnce(t *testing.T, e *Env) {
	r := newRunner(t, ack)
	c := consume(t, e.NewSource(t), r)
	e.Publish(t, messages(5)...)
	s := r.await("5 deliveries", func(s []seen) bool { return len(s) >= 5 })
	c.stop(t)
	want := payloads(s)
	slices.Sort(want)
	if !slices.Equal(want, []string{"m0", "m1", "m2", "m3", "m4"}) {
		t.Errorf("delivered %v, want m0-m4 once each", payloads(s))
	}
	for _, x := range s {
		m := x.d.Message()
		i := x.payload[1:]
		if x.attempt != 1 {
			t.Errorf("%s: attempt %d, want 1", x.payload, x.attempt)
		}
		if m.Header.Get("idempotency-key") != "k"+i || m.Header.Get("X-Test") != "v"+i {
			t.Errorf("%s: headers %v, want Idempotency-Key k%s and X-Test v%s", x.payload, m.Header, i, i)
		}
		if m.Origin.Transport != e.Transport || m.Origin.Topic == "" {
			t.Errorf("%s: origin %+v, want transport %q and a topic", x.payload, m.Origin, e.Transport)
		}
	}
	onlyMarker(t, e, "it was acked")
}

// A nakked delivery comes again after its delay, as attempt 2, with the same
// payload and headers.
func testNakRedelivers(t *testing.T, e *Env) {
	const delay = 500 * time.Millisecond
	r := newRunner(t, func(ctx context.Context, d consumer.Delivery) {
		if d.Attempt() == 1 {
			_ = d.Nak(ctx, delay)
			return
		}
		_ = d.Ack(ctx)
	})
	consume(t, e.NewSource(t), r)
	e.Publish(t, messages(1)...)
	s := r.await("the redelivery", func(s []seen) bool { return len(s) >= 2 })
	first, second := s[0], s[1]
	if second.payload != "m0" || second.attempt != 2 {
		t.Fatalf("after a nak: %s#%d, want m0#2", second.payload, second.attempt)
	}
	if h := second.d.Message().Header.Get("X-Test"); h != "v0" {
		t.Errorf("redelivery X-Test %q, want v0", h)
	}
	// The broker's clock and the delivery path add latency, never take it
	// away; 50ms is the slack of timers on a loaded machine.
	if gap := second.at.Sub(first.at); gap < delay-50*time.Millisecond {
		t.Errorf("redelivered %s after a nak with delay %s", gap, delay)
	}
}

// Attempt counts deliveries of a message: 1, 2, 3 across two naks.
func testAttemptsCount(t *testing.T, e *Env) {
	r := newRunner(t, func(ctx context.Context, d consumer.Delivery) {
		if d.Attempt() < 3 {
			_ = d.Nak(ctx, 0)
			return
		}
		_ = d.Ack(ctx)
	})
	consume(t, e.NewSource(t), r)
	e.Publish(t, messages(1)...)
	s := r.await("three deliveries", func(s []seen) bool { return len(s) >= 3 })
	var got []int
	for _, x := range s {
		got = append(got, x.attempt)
	}
	if !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("attempts %v, want [1 2 3]", got)
	}
}

// A dead letter carries the payload, the original headers and the
// dead-letter headers, and the dead-lettered delivery, once acked, does not
// come again.
func testDeadLetter(t *testing.T, e *Env) {
	dl := consumer.DeadLetter{Reason: "permanent_error", Err: "boom", Key: "k0", Handler: "sourcetest", Attempts: 1}
	r := newRunner(t, func(ctx context.Context, d consumer.Delivery) {
		if err := d.DeadLetter(ctx, dl); err != nil {
			t.Errorf("DeadLetter: %v", err)
			_ = d.Nak(ctx, time.Second)
			return
		}
		_ = d.Ack(ctx)
	})
	c := consume(t, e.NewSource(t), r)
	e.Publish(t, messages(1)...)
	s := r.await("the delivery", func(s []seen) bool { return len(s) >= 1 })
	c.stop(t)
	origin := s[0].d.Message().Origin
	var dead []*consumer.Message
	poll := time.NewTicker(50 * time.Millisecond) // the dead letter is on another topic: nothing to wait on
	defer poll.Stop()
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); <-poll.C {
		if dead = e.DeadLetters(t); len(dead) > 0 {
			break
		}
	}
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dead))
	}
	m := dead[0]
	want := map[string]string{
		consumer.HeaderDeadLetterReason:    "permanent_error",
		consumer.HeaderDeadLetterError:     "boom",
		consumer.HeaderDeadLetterKey:       "k0",
		consumer.HeaderDeadLetterHandler:   "sourcetest",
		consumer.HeaderDeadLetterAttempts:  "1",
		consumer.HeaderDeadLetterTransport: e.Transport,
		consumer.HeaderDeadLetterTopic:     origin.Topic,
		consumer.HeaderDeadLetterOffset:    strconv.FormatInt(origin.Offset, 10),
		"Idempotency-Key":                  "k0",
		"X-Test":                           "v0",
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got := m.Header.Get(k); got != want[k] {
			t.Errorf("dead letter header %s = %q, want %q", k, got, want[k])
		}
	}
	if string(m.Payload) != "m0" {
		t.Errorf("dead letter payload %q, want m0", m.Payload)
	}
	onlyMarker(t, e, "it was dead-lettered and acked")
}

// A delivery that heartbeats is not delivered again while it runs, however
// long past the broker's ack wait: a redelivery would reach the runner,
// which has free slots, while the first delivery is still held.
func testHeartbeatHolds(t *testing.T, e *Env) {
	hold := 3 * e.AckWait
	if hold == 0 {
		hold = time.Second
	}
	every := max(e.AckWait/4, 50*time.Millisecond)
	held := make(chan struct{})
	var once sync.Once
	r := newRunner(t, func(ctx context.Context, d consumer.Delivery) {
		if d.Attempt() > 1 {
			_ = d.Ack(ctx)
			return
		}
		defer once.Do(func() { close(held) })
		end := time.NewTimer(hold)
		defer end.Stop()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				if err := d.Heartbeat(ctx); err != nil {
					t.Errorf("Heartbeat: %v", err)
				}
			case <-end.C:
				_ = d.Ack(ctx)
				return
			}
		}
	})
	c := consume(t, e.NewSource(t), r)
	e.Publish(t, messages(1)...)
	select {
	case <-held:
	case <-time.After(wait + hold):
		t.Fatal("the held delivery did not finish")
	}
	c.stop(t)
	r.mu.Lock()
	s := slices.Clone(r.seen)
	r.mu.Unlock()
	if len(s) != 1 {
		t.Errorf("deliveries %s: want m0 once (a heartbeat must hold off redelivery for %s past an ack wait of %s)", describe(s), hold, e.AckWait)
	}
}

// Cancelling Consume does not cancel the work in flight: Consume waits for
// it, its Ack counts, and it is not delivered again.
func testStopDrains(t *testing.T, e *Env) {
	started, release := make(chan struct{}), make(chan struct{})
	var ctxErr error
	r := newRunner(t, func(ctx context.Context, d consumer.Delivery) {
		close(started)
		<-release
		ctxErr = ctx.Err()
		_ = d.Ack(ctx)
	})
	c := consume(t, e.NewSource(t), r)
	e.Publish(t, messages(1)...)
	select {
	case <-started:
	case <-time.After(wait):
		t.Fatal("no delivery")
	}
	c.cancel()
	select {
	case err := <-c.done:
		close(c.done)
		t.Fatalf("Consume returned (%v) while a delivery was still in Process", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	c.stop(t)
	if ctxErr != nil {
		t.Errorf("the context of the delivery in flight ended (%v) when Consume's was cancelled; stopping the fetch is not stopping the work", ctxErr)
	}
	onlyMarker(t, e, "it was acked while the source stopped")
}

// Every delivery shown to Prepare is processed exactly once.
func testPreparedProcessedOnce(t *testing.T, e *Env) {
	r := newRunner(t, ack)
	c := consume(t, e.NewSource(t), r)
	e.Publish(t, messages(20)...)
	r.await("20 deliveries", func(s []seen) bool { return len(s) >= 20 })
	c.stop(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.prepared) == 0 {
		t.Error("the source never called Prepare")
	}
	for d, n := range r.prepared {
		if n != 1 || r.process[d] != 1 {
			t.Errorf("%s: prepared %d times, processed %d times; want once each", d.Message().Payload, n, r.process[d])
		}
	}
	if len(r.process) != len(r.prepared) {
		t.Errorf("%d deliveries processed, %d prepared: every delivery must be prepared first", len(r.process), len(r.prepared))
	}
}

// String names the Env in failures.
func (e *Env) String() string { return fmt.Sprintf("sourcetest.Env(%s)", e.Transport) }
