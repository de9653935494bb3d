package dispatch_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// chanSource is a Source fed from a channel; every delivery runs on its own
// goroutine, as a NATS source would.
type chanSource struct {
	in   chan consumer.Delivery
	fail error // returned by Consume at once when set
}

func (s *chanSource) Consume(ctx context.Context, r consumer.Runner) error {
	if s.fail != nil {
		return s.fail
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-s.in:
			r.Prepare(ctx, []consumer.Delivery{d})
			wg.Go(func() { r.Process(context.WithoutCancel(ctx), d) })
		}
	}
}

type delivery struct {
	msg     consumer.Message
	attempt int
	dlErr   error

	mu    sync.Mutex
	acked bool
	naks  []time.Duration
	dead  []consumer.DeadLetter
	done  chan struct{}
}

func newDelivery(payload string) *delivery {
	return &delivery{msg: consumer.Message{Payload: []byte(payload), Origin: consumer.Origin{Transport: "test"}}, attempt: 1, done: make(chan struct{})}
}

func (d *delivery) Message() *consumer.Message { return &d.msg }
func (d *delivery) Attempt() int               { return d.attempt }
func (d *delivery) Ack(context.Context) error {
	d.mu.Lock()
	d.acked = true
	d.mu.Unlock()
	close(d.done)
	return nil
}
func (d *delivery) Nak(_ context.Context, delay time.Duration) error {
	d.mu.Lock()
	d.naks = append(d.naks, delay)
	d.mu.Unlock()
	close(d.done)
	return nil
}
func (d *delivery) Heartbeat(context.Context) error { return nil }
func (d *delivery) DeadLetter(_ context.Context, dl consumer.DeadLetter) error {
	if d.dlErr != nil {
		return d.dlErr
	}
	d.mu.Lock()
	d.dead = append(d.dead, dl)
	d.mu.Unlock()
	return nil
}

// start runs w until ctx ends; the channel receives Run's result.
func start(ctx context.Context, w *dispatch.Worker) <-chan error {
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(ctx) }()
	return runErr
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestWorkerDirectAcksAndRetries(t *testing.T) {
	src := &chanSource{in: make(chan consumer.Delivery)}
	w := dispatch.NewWorker(dispatch.Config{})
	err := w.Handle("h", src, consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) ([]byte, error) {
		switch string(m.Payload) {
		case "fail":
			return nil, errors.New("transient")
		case "perm":
			return nil, dispatch.Permanent(errors.New("bad"))
		case "later":
			return nil, dispatch.RetryAfter(time.Minute, nil)
		}
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := start(ctx, w)

	ok, fail, perm, later := newDelivery("ok"), newDelivery("fail"), newDelivery("perm"), newDelivery("later")
	for _, d := range []*delivery{ok, fail, perm, later} {
		src.in <- d
		wait(t, d.done, string(d.msg.Payload))
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	if !ok.acked {
		t.Error("ok: not acked")
	}
	if fail.acked || len(fail.naks) != 1 || fail.naks[0] < 800*time.Millisecond || fail.naks[0] > 1200*time.Millisecond {
		t.Errorf("fail: acked %v naks %v, want one nak of ~1s", fail.acked, fail.naks)
	}
	if !perm.acked || len(perm.dead) != 1 || perm.dead[0].Reason != "permanent_error" {
		t.Errorf("perm: acked %v dead %+v, want dead-lettered and acked", perm.acked, perm.dead)
	}
	if len(later.naks) != 1 || later.naks[0] != time.Minute {
		t.Errorf("later: naks %v, want one of 1m", later.naks)
	}
}

func TestWorkerShutdownDrainsThenCancels(t *testing.T) {
	src := &chanSource{in: make(chan consumer.Delivery)}
	w := dispatch.NewWorker(dispatch.Config{ShutdownTimeout: 200 * time.Millisecond})
	started := make(chan struct{}, 2)
	causes := make(chan error, 2)
	err := w.Handle("h", src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		started <- struct{}{}
		if string(m.Payload) == "quick" {
			<-ctx.Done() // never: the quick one finishes inside the drain
		}
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := start(ctx, w)
	d := newDelivery("slow")
	src.in <- d
	wait(t, started, "handler start")
	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("Run = %v, want nil after a drain", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the shutdown timeout")
	}
	if c := <-causes; !errors.Is(c, dispatch.ErrShutdownTimeout) {
		t.Fatalf("handler cancelled with cause %v, want ErrShutdownTimeout", c)
	}
	if d.acked || len(d.naks) != 1 || d.naks[0] != 0 {
		t.Fatalf("cancelled delivery: acked %v naks %v, want one immediate nak", d.acked, d.naks)
	}
}

func TestWorkerSourceFailureStopsRun(t *testing.T) {
	w := dispatch.NewWorker(dispatch.Config{})
	boom := errors.New("stream deleted")
	ok := &chanSource{in: make(chan consumer.Delivery)}
	if err := w.Handle("a", &chanSource{fail: boom}, consumer.HandlerFunc(nop)); err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("b", ok, consumer.HandlerFunc(nop)); err != nil {
		t.Fatal(err)
	}
	err := w.Run(context.Background())
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("Run = %v, want the source's error naming handler a", err)
	}
}

func TestWorkerConcurrencyCap(t *testing.T) {
	src := &chanSource{in: make(chan consumer.Delivery)}
	w := dispatch.NewWorker(dispatch.Config{})
	var cur, peak atomic.Int32
	gate := make(chan struct{})
	err := w.Handle("h", src, consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) {
		n := cur.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-gate
		cur.Add(-1)
		return nil, nil
	}), dispatch.WithConcurrency(3))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := start(ctx, w)
	var ds []*delivery
	for range 10 {
		d := newDelivery("x")
		ds = append(ds, d)
		src.in <- d
	}
	deadline := time.Now().Add(5 * time.Second)
	for cur.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(gate)
	for _, d := range ds {
		wait(t, d.done, "delivery")
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	if peak.Load() != 3 {
		t.Fatalf("peak concurrency %d, want exactly the cap 3", peak.Load())
	}
}

func TestHandleValidates(t *testing.T) {
	w := dispatch.NewWorker(dispatch.Config{})
	src := &chanSource{}
	for _, c := range []struct {
		name string
		src  consumer.Source
		opts []dispatch.HandleOption
		want string
	}{
		{"", src, nil, "handler name"},
		{"has:colon", src, nil, "handler name"},
		{"ok", nil, nil, "source is nil"},
		{"ok", src, []dispatch.HandleOption{dispatch.WithConcurrency(0)}, "concurrency"},
	} {
		err := w.Handle(c.name, c.src, consumer.HandlerFunc(nop), c.opts...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Handle(%q): %v, want an error mentioning %q", c.name, err, c.want)
		}
	}
	if err := w.Handle("dup", src, consumer.HandlerFunc(nop)); err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("dup", src, consumer.HandlerFunc(nop)); err == nil {
		t.Fatal("a second handler of the same name was accepted")
	}
	if err := dispatch.NewWorker(dispatch.Config{}).Run(context.Background()); err == nil {
		t.Fatal("Run without handlers must fail")
	}
}

func nop(context.Context, *consumer.Message) ([]byte, error) { return nil, nil }

func TestHeaderIsCaseInsensitive(t *testing.T) {
	h := consumer.Header{"idempotency-key": {"a", "b"}}
	if h.Get("Idempotency-Key") != "a" {
		t.Fatal("Get must match without regard to case and return the first value")
	}
	h.Set("IDEMPOTENCY-KEY", "c")
	if len(h) != 1 || h.Get("idempotency-key") != "c" {
		t.Fatalf("Set must replace every case variant, got %v", h)
	}
	c := h.Clone()
	c.Set("x", "y")
	if h.Get("x") != "" {
		t.Fatal("Clone shares storage")
	}
}

func TestBackoffGrowsAndCaps(t *testing.T) {
	for attempt, base := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 20: time.Minute} {
		for range 50 {
			d := dispatch.Backoff(attempt, time.Second, time.Minute)
			if d < base*8/10 || d > base*12/10 {
				t.Fatalf("Backoff(%d) = %s, want %s ±20%%", attempt, d, base)
			}
		}
	}
}

func TestErrorConstructors(t *testing.T) {
	base := errors.New("x")
	p := dispatch.Permanent(base)
	if !dispatch.IsPermanent(p) || !errors.Is(p, base) {
		t.Fatal("Permanent must be detectable and unwrap to its cause")
	}
	if dispatch.IsPermanent(base) {
		t.Fatal("a plain error is not permanent")
	}
	r := dispatch.RetryAfter(time.Second, base)
	if d, ok := dispatch.RetryDelay(r); !ok || d != time.Second || !errors.Is(r, base) {
		t.Fatal("RetryAfterErr must carry its delay and cause")
	}
	if d, _ := dispatch.RetryDelay(dispatch.RetryAfter(-time.Second, nil)); d != 0 {
		t.Fatal("a negative delay must become zero")
	}
	_, err := dispatch.CallHandler(context.Background(), consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) {
		panic("boom")
	}), &consumer.Message{})
	var pe *consumer.PanicError
	if !errors.As(err, &pe) || pe.Value != "boom" || len(pe.Stack) == 0 {
		t.Fatalf("CallHandler must recover a panic into *PanicError with a stack, got %v", err)
	}
}

func TestDeadLetterHeaders(t *testing.T) {
	dl := consumer.DeadLetter{Reason: "max_attempts", Err: "boom", Key: "k1", Handler: "orders", Attempts: 5}
	h := dl.Headers(consumer.Origin{Transport: "kafka", Topic: "orders", Partition: 3, Offset: 42})
	want := map[string]string{
		consumer.HeaderDeadLetterReason: "max_attempts", consumer.HeaderDeadLetterError: "boom",
		consumer.HeaderDeadLetterKey: "k1", consumer.HeaderDeadLetterAttempts: "5",
		consumer.HeaderDeadLetterTopic: "orders", consumer.HeaderDeadLetterPartition: "3",
		consumer.HeaderDeadLetterOffset: "42", consumer.HeaderDeadLetterHandler: "orders",
	}
	for k, v := range want {
		if h.Get(k) != v {
			t.Errorf("%s = %q, want %q", k, h.Get(k), v)
		}
	}
}

type ctxKey string

// valueSource passes every delivery a context that nothing cancels and that
// carries a value of its own, as the NATS source passes one shared context.
type valueSource struct{ in chan consumer.Delivery }

func (s *valueSource) Consume(ctx context.Context, r consumer.Runner) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	work := context.WithValue(context.WithoutCancel(ctx), ctxKey("source"), "s")
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-s.in:
			r.Prepare(work, []consumer.Delivery{d})
			wg.Go(func() { r.Process(work, d) })
		}
	}
}

// TestWorkerContextValuesAndEnd: the handler's context carries the values of
// Run's context and of the source's, and ends when the handler returns, also
// when the source shares one context between deliveries.
func TestWorkerContextValuesAndEnd(t *testing.T) {
	src := &valueSource{in: make(chan consumer.Delivery)}
	w := dispatch.NewWorker(dispatch.Config{})
	ctxs := make(chan context.Context, 2)
	err := w.Handle("h", src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		if ctx.Err() != nil {
			t.Errorf("%s: handler context already done: %v", m.Payload, ctx.Err())
		}
		if ctx.Value(ctxKey("run")) != "r" || ctx.Value(ctxKey("source")) != "s" {
			t.Errorf("%s: values run=%v source=%v, want r and s", m.Payload, ctx.Value(ctxKey("run")), ctx.Value(ctxKey("source")))
		}
		ctxs <- ctx
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey("run"), "r"))
	runErr := start(ctx, w)
	for _, p := range []string{"a", "b"} {
		d := newDelivery(p)
		src.in <- d
		wait(t, d.done, p)
		if !d.acked {
			t.Errorf("%s: not acked", p)
		}
		if hctx := <-ctxs; hctx.Err() == nil {
			t.Errorf("%s: handler context not done after the handler returned", p)
		}
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
}

// ctxSource passes each delivery the context it came with, as the Kafka
// source passes its partition's context (cancelled when the partition is
// revoked) to every delivery of the partition.
type ctxSource struct {
	in chan ctxDelivery
}

type ctxDelivery struct {
	ctx context.Context
	d   consumer.Delivery
}

func (s *ctxSource) Consume(ctx context.Context, r consumer.Runner) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case cd := <-s.in:
			wg.Go(func() { r.Process(cd.ctx, cd.d) })
		}
	}
}

// TestWorkerSourceContextCancelReachesHandler: deliveries sharing a source
// context that the source cancels (a revoked partition) see it cancelled,
// with its cause, while their handler runs; deliveries before it finish
// normally, and a new context works afterwards.
func TestWorkerSourceContextCancelReachesHandler(t *testing.T) {
	src := &ctxSource{in: make(chan ctxDelivery)}
	w := dispatch.NewWorker(dispatch.Config{})
	errRevoked := errors.New("revoked")
	started := make(chan struct{})
	causes := make(chan error, 1)
	err := w.Handle("h", src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		if string(m.Payload) != "block" {
			return nil, nil
		}
		close(started)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := start(ctx, w)

	part, revoke := context.WithCancelCause(context.Background())
	for _, p := range []string{"a", "b"} {
		d := newDelivery(p)
		src.in <- ctxDelivery{part, d}
		wait(t, d.done, p)
		if !d.acked {
			t.Fatalf("%s: not acked", p)
		}
	}
	blocked := newDelivery("block")
	src.in <- ctxDelivery{part, blocked}
	wait(t, started, "the blocking handler")
	revoke(errRevoked)
	select {
	case cause := <-causes:
		if !errors.Is(cause, errRevoked) {
			t.Fatalf("handler context's cause %v, want %v", cause, errRevoked)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling the source's context did not reach the running handler")
	}
	wait(t, blocked.done, "the blocked delivery settled")

	part2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	d := newDelivery("c")
	src.in <- ctxDelivery{part2, d}
	wait(t, d.done, "c")
	if !d.acked {
		t.Fatal("c: not acked after the first context was cancelled")
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
}
