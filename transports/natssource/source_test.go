package natssource_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

func newSource(t *testing.T, e *env, cfg natssource.Config) *natssource.Source {
	t.Helper()
	if cfg.Stream == "" {
		cfg.Stream = e.stream
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "c"
	}
	if cfg.Logger == nil {
		cfg.Logger = testenv.Logger(t)
	}
	if cfg.FetchMaxWait == 0 {
		cfg.FetchMaxWait = 200 * time.Millisecond
	}
	src, err := natssource.New(e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func TestConfigErrorsNameTheField(t *testing.T) {
	nc := &nats.Conn{}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ok := natssource.Config{Stream: "S", Consumer: "c"}
	cases := []struct {
		field string
		mod   func(*natssource.Config)
	}{
		{"Stream", func(c *natssource.Config) { c.Stream = "" }},
		{"Stream", func(c *natssource.Config) { c.Stream = "a.b" }},
		{"Stream", func(c *natssource.Config) { c.Stream = "S%d" }},
		{"Consumer", func(c *natssource.Config) { c.Consumer = "c%" }},
		{"Consumer", func(c *natssource.Config) { c.Consumer = "" }},
		{"Consumer", func(c *natssource.Config) { c.Consumer = "x y" }},
		{"Subject", func(c *natssource.Config) { c.Subject = "a.>.b" }},
		{"AckWait", func(c *natssource.Config) { c.AckWait = time.Millisecond }},
		{"Batch", func(c *natssource.Config) { c.Batch = -1 }},
		{"MaxAckPending", func(c *natssource.Config) { c.MaxAckPending = -1 }},
		{"FetchMaxWait", func(c *natssource.Config) { c.FetchMaxWait = time.Millisecond }},
		{"RequestTimeout", func(c *natssource.Config) { c.RequestTimeout = -time.Second }},
		{"DeadLetterSubject", func(c *natssource.Config) { c.DeadLetterSubject = "dlq.*" }},
	}
	for _, tc := range cases {
		cfg := ok
		tc.mod(&cfg)
		_, err := natssource.New(js, cfg)
		var ce *consumer.ConfigError
		if !errors.Is(err, natssource.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != tc.field || ce.Reason == "" {
			t.Errorf("%s: got %v, want a ConfigError for %s wrapping ErrInvalidConfig", tc.field, err, tc.field)
		}
		if verr := cfg.Validate(); verr == nil || verr.Error() != err.Error() {
			t.Errorf("%s: Validate = %v, New = %v; want the same error", tc.field, verr, err)
		}
	}
	src, err := natssource.New(js, ok)
	if err != nil {
		t.Fatalf("valid config: %v", err)
	}
	got := src.Config()
	if got.AckWait != 30*time.Second || got.FetchMaxWait != time.Second || got.RequestTimeout != 5*time.Second {
		t.Errorf("defaults: AckWait %s FetchMaxWait %s RequestTimeout %s", got.AckWait, got.FetchMaxWait, got.RequestTimeout)
	}
	if _, err := natssource.New(nil, ok); !errors.Is(err, natssource.ErrInvalidConfig) {
		t.Errorf("nil JetStream: %v", err)
	}
}

// TestFetchAck: every message is handled once with its origin and headers,
// and acked: the consumer ends with nothing pending. The consumer is created
// with the documented configuration, MaxAckPending following concurrency.
func TestFetchAck(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n = 60
		e.publish(t, n)
		s := newSeen()
		var bad atomic.Value
		h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			o := m.Origin
			want := "m" + strings.TrimPrefix(m.Header.Get("Idempotency-Key"), "k")
			switch {
			case o.Transport != "nats" || o.Topic != e.stream || !strings.HasPrefix(o.Subject, e.subj+".") || o.Offset < 1 || o.Offset > n:
				bad.Store(fmt.Sprintf("origin %+v", o))
			case string(m.Payload) != want:
				bad.Store(fmt.Sprintf("payload %q with header key %q", m.Payload, m.Header.Get("Idempotency-Key")))
			case m.Key != nil:
				bad.Store("Key set for NATS")
			}
			s.add(string(m.Payload), int(o.Offset))
			return nil, nil
		})
		src := newSource(t, e, natssource.Config{AckWait: 7 * time.Second})
		run(t, dispatch.Config{}, src, h, dispatch.WithConcurrency(7))
		testenv.EventuallyNil(t, 20*time.Second, "every message handled", func() error {
			if c := s.count(); c < n {
				return fmt.Errorf("%d of %d handled", c, n)
			}
			return nil
		})
		e.drained(t, "c", 10*time.Second)
		if s.count() != n {
			t.Errorf("handled %d times, want %d", s.count(), n)
		}
		for i := range n {
			if r := s.get(fmt.Sprintf("m%d", i)); len(r) != 1 || r[0] != i+1 {
				t.Errorf("m%d: offsets %v, want [%d]", i, r, i+1)
			}
		}
		if v := bad.Load(); v != nil {
			t.Error(v)
		}
		c := e.consumerInfo(t, "c").Config
		if c.AckPolicy != jetstream.AckExplicitPolicy || c.MaxAckPending != 7 || c.MaxDeliver != -1 || c.AckWait != 7*time.Second || c.Durable != "c" {
			t.Errorf("created consumer: ack %s, MaxAckPending %d, MaxDeliver %d, AckWait %s, durable %q", c.AckPolicy, c.MaxAckPending, c.MaxDeliver, c.AckWait, c.Durable)
		}
	})
}

// TestExistingConsumerFollowsConfig: an existing consumer
// gets the configured AckWait and a MaxAckPending raised to the configured
// one, with an Info line naming old and new values; its filter is kept.
func TestExistingConsumerFollowsConfig(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		ctx := ctxT(t, 5*time.Second)
		_, err := e.js.CreateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
			Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 11 * time.Second, MaxAckPending: 1,
			FilterSubject: e.subj + ".1",
		})
		if err != nil {
			t.Fatal(err)
		}
		e.publish(t, 6) // m1 and m4 are on .1
		s := newSeen()
		logs := &testenv.SyncBuffer{}
		src := newSource(t, e, natssource.Config{Subject: e.subj + ".>", AckWait: 3 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		run(t, dispatch.Config{}, src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			s.add(string(m.Payload), 0)
			return nil, nil
		}), dispatch.WithConcurrency(2))
		e.drained(t, "c", 10*time.Second)
		if s.count() != 2 || len(s.get("m1")) != 1 || len(s.get("m4")) != 1 {
			t.Errorf("handled %v, want m1 and m4 once", s.runs)
		}
		c := e.consumerInfo(t, "c").Config
		if c.MaxAckPending != 2 || c.AckWait != 3*time.Second || c.FilterSubject != e.subj+".1" {
			t.Errorf("existing consumer: MaxAckPending %d (want 2) AckWait %s (want 3s) filter %q (want kept)", c.MaxAckPending, c.AckWait, c.FilterSubject)
		}
		for _, want := range []string{`level=INFO msg="updated the existing consumer to follow the configuration"`, `old_ack_wait=11s ack_wait=3s old_max_ack_pending=1 max_ack_pending=2`} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("logs lack %s:\n%s", want, logs)
			}
		}
	})
}

// TestExistingConsumerLargerMaxAckPendingKept: a MaxAckPending above the
// configured one is kept with a warning; with BindOnly a different AckWait
// is a warning, not an update.
func TestExistingConsumerLargerMaxAckPendingKept(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		ctx := ctxT(t, 5*time.Second)
		_, err := e.js.CreateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
			Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 11 * time.Second, MaxAckPending: 100,
		})
		if err != nil {
			t.Fatal(err)
		}
		e.publish(t, 3)
		logs := &testenv.SyncBuffer{}
		idle := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })
		src := newSource(t, e, natssource.Config{AckWait: 3 * time.Second, BindOnly: true, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		run(t, dispatch.Config{}, src, idle, dispatch.WithConcurrency(2))
		e.drained(t, "c", 10*time.Second)
		c := e.consumerInfo(t, "c").Config
		if c.MaxAckPending != 100 || c.AckWait != 11*time.Second {
			t.Errorf("existing consumer changed: MaxAckPending %d AckWait %s", c.MaxAckPending, c.AckWait)
		}
		for _, want := range []string{
			`level=WARN msg="the existing consumer's MaxAckPending is above the configured max_ack_pending; kept`,
			`max_ack_pending=100 configured=2`,
			`level=WARN msg="the existing consumer differs from the configuration; BindOnly is set, so it is not updated"`,
			`old_ack_wait=11s ack_wait=3s old_max_ack_pending=100 max_ack_pending=100`,
		} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("logs lack %s:\n%s", want, logs)
			}
		}
	})
}

// TestConcurrencyCap: at most Concurrency handlers run at once, and the cap
// is reached.
func TestConcurrencyCap(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n, limit = 40, 3
		e.publish(t, n)
		var active, peak, done atomic.Int32
		h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			a := active.Add(1)
			for {
				p := peak.Load()
				if a <= p || peak.CompareAndSwap(p, a) {
					break
				}
			}
			time.Sleep(15 * time.Millisecond) // simulated work
			active.Add(-1)
			done.Add(1)
			return nil, nil
		})
		run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), h, dispatch.WithConcurrency(limit))
		testenv.EventuallyNil(t, 20*time.Second, "every message done", func() error {
			if d := done.Load(); d != n {
				return fmt.Errorf("%d of %d done", d, n)
			}
			return nil
		})
		if p := peak.Load(); p != limit {
			t.Errorf("peak concurrency %d, want exactly %d", p, limit)
		}
		if got := e.consumerInfo(t, "c").Config.MaxAckPending; got != limit {
			t.Errorf("MaxAckPending %d, want %d", got, limit)
		}
	})
}

// batchRecorder is a Processor that records Prepare batches and checks that
// every prepared delivery is processed once, after its Prepare.
type batchRecorder struct {
	mu       sync.Mutex
	batches  []int
	prepared map[int64]bool
	errs     []string
	proc     int
}

func (b *batchRecorder) Prepare(ctx context.Context, batch []consumer.Delivery) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batches = append(b.batches, len(batch))
	for _, d := range batch {
		off := d.Message().Origin.Offset
		if _, dup := b.prepared[off]; dup {
			b.errs = append(b.errs, fmt.Sprintf("seq %d prepared twice", off))
		}
		b.prepared[off] = false
	}
}

func (b *batchRecorder) Process(ctx context.Context, d consumer.Delivery) {
	off := d.Message().Origin.Offset
	b.mu.Lock()
	if p, ok := b.prepared[off]; !ok || p {
		b.errs = append(b.errs, fmt.Sprintf("seq %d processed without a prepare (or twice)", off))
	}
	b.prepared[off] = true
	b.proc++
	b.mu.Unlock()
	time.Sleep(5 * time.Millisecond) // simulated work, lets batches queue up
	if err := d.Ack(ctx); err != nil {
		b.mu.Lock()
		b.errs = append(b.errs, err.Error())
		b.mu.Unlock()
	}
}

// ProcessBatch processes ds one at a time, as a processor of a handler that
// is not a batch handler does.
func (b *batchRecorder) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	for _, d := range ds {
		b.Process(ctx, d)
	}
}

func (b *batchRecorder) Batching() bool { return false }

// TestPrepareOncePerBatch: a fetched batch is prepared once, never larger
// than the concurrency, and each delivery is processed once after it.
func TestPrepareOncePerBatch(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n, limit = 100, 8
		e.publish(t, n)
		b := &batchRecorder{prepared: map[int64]bool{}}
		proc := func(string, consumer.Handler) consumer.Processor { return b }
		run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), consumer.HandlerFunc(nil), dispatch.WithConcurrency(limit), dispatch.WithProcessor(proc))
		e.drained(t, "c", 20*time.Second)
		b.mu.Lock()
		defer b.mu.Unlock()
		sum, big := 0, 0
		for _, k := range b.batches {
			sum += k
			big = max(big, k)
			if k > limit || k < 1 {
				t.Errorf("batch of %d with concurrency %d", k, limit)
			}
		}
		if sum != n || b.proc != n {
			t.Errorf("prepared %d, processed %d, want %d", sum, b.proc, n)
		}
		if big < 2 {
			t.Errorf("largest batch %d: fetches are not batched (%v)", big, b.batches)
		}
		for _, s := range b.errs {
			t.Error(s)
		}
	})
}

// attemptRecorder naks with a short delay until the third attempt, recording
// Attempt and the time of each delivery.
type attemptRecorder struct {
	mu       sync.Mutex
	attempts []int
	at       []time.Time
	delay    time.Duration
	okAt     int
	nakErr   error
}

func (a *attemptRecorder) Process(ctx context.Context, d consumer.Delivery) {
	a.mu.Lock()
	a.attempts = append(a.attempts, d.Attempt())
	a.at = append(a.at, time.Now())
	a.mu.Unlock()
	if d.Attempt() >= a.okAt {
		_ = d.Ack(ctx)
		return
	}
	if err := d.Nak(ctx, a.delay); err != nil {
		a.mu.Lock()
		a.nakErr = err
		a.mu.Unlock()
	}
}

// TestNakWithDelayAndAttempt: Nak(delay) redelivers after the delay, not
// before, and Attempt counts NumDelivered.
func TestNakWithDelayAndAttempt(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		e.publish(t, 1)
		a := &attemptRecorder{delay: 400 * time.Millisecond, okAt: 3}
		proc := func(string, consumer.Handler) consumer.Processor { return consumer.ProcessorFunc(a.Process) }
		run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), consumer.HandlerFunc(nil), dispatch.WithProcessor(proc))
		e.drained(t, "c", 10*time.Second)
		a.mu.Lock()
		defer a.mu.Unlock()
		if !slices.Equal(a.attempts, []int{1, 2, 3}) {
			t.Fatalf("attempts %v, want [1 2 3]", a.attempts)
		}
		for i := 1; i < len(a.at); i++ {
			if gap := a.at[i].Sub(a.at[i-1]); gap < a.delay-50*time.Millisecond {
				t.Errorf("redelivery %d after %s, want at least %s", i+1, gap, a.delay)
			}
		}
		if a.nakErr != nil {
			t.Error(a.nakErr)
		}
	})
}

// heartbeating is a Processor that heartbeats every period while the
// handler runs (as the engine's lease renewer does), then acks.
func heartbeating(period time.Duration) consumer.ProcessorFactory {
	return func(_ string, h consumer.Handler) consumer.Processor {
		return consumer.ProcessorFunc(func(ctx context.Context, d consumer.Delivery) {
			done := make(chan struct{})
			var wg sync.WaitGroup
			if period > 0 {
				wg.Go(func() {
					tk := time.NewTicker(period)
					defer tk.Stop()
					for {
						select {
						case <-done:
							return
						case <-tk.C:
							_ = d.Heartbeat(ctx)
						}
					}
				})
			}
			_, err := h.Handle(ctx, d.Message())
			close(done)
			wg.Wait()
			if err != nil {
				_ = d.Nak(ctx, 0)
				return
			}
			_ = d.Ack(ctx)
		})
	}
}

// TestHeartbeatPreventsRedelivery: a handler running 3× AckWait that
// heartbeats is not redelivered; without heartbeats it is (the control that
// shows the test can fail).
func TestHeartbeatPreventsRedelivery(t *testing.T) {
	const ackWait = time.Second
	for _, tc := range []struct {
		name      string
		period    time.Duration
		redeliver bool
	}{{"heartbeat", ackWait / 3, false}, {"none", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			forEachServer(t, func(t *testing.T, e *env) {
				e.publish(t, 1)
				s := newSeen()
				var starts atomic.Int32
				h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
					if starts.Add(1) == 1 {
						time.Sleep(3 * ackWait) // the long handler
					}
					s.add(string(m.Payload), 0)
					return nil, nil
				})
				run(t, dispatch.Config{}, newSource(t, e, natssource.Config{AckWait: ackWait}), h,
					dispatch.WithConcurrency(2), dispatch.WithProcessor(heartbeating(tc.period)))
				e.drained(t, "c", 10*time.Second)
				if got := starts.Load(); (got > 1) != tc.redeliver {
					t.Errorf("handler started %d times; redelivery expected: %v", got, tc.redeliver)
				}
			})
		})
	}
}

// TestDeadLetter: a permanent failure publishes the message with its own
// headers and the dead-letter headers, then acks it; into a stream and, when
// no stream captures the subject, on core NATS.
func TestDeadLetter(t *testing.T) {
	for _, inStream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", inStream), func(t *testing.T) {
			forEachServer(t, func(t *testing.T, e *env) {
				dlSubj := "dlq." + e.subj
				var sub *nats.Subscription
				if inStream {
					e.createStream(t, e.stream+"_DLQ", dlSubj)
				} else {
					var err error
					if sub, err = e.nc.SubscribeSync(dlSubj); err != nil {
						t.Fatal(err)
					}
				}
				e.publish(t, 1)
				h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
					return nil, dispatch.Permanent(errors.New("boom"))
				})
				run(t, dispatch.Config{}, newSource(t, e, natssource.Config{DeadLetterSubject: dlSubj}), h)
				e.drained(t, "c", 10*time.Second)
				var dl *nats.Msg
				if inStream {
					ctx := ctxT(t, 5*time.Second)
					st, err := e.js.Stream(ctx, e.stream+"_DLQ")
					if err != nil {
						t.Fatal(err)
					}
					raw, err := st.GetMsg(ctx, 1)
					if err != nil {
						t.Fatalf("dead letter not stored: %v", err)
					}
					dl = &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
				} else {
					var err error
					if dl, err = sub.NextMsg(5 * time.Second); err != nil {
						t.Fatalf("no dead letter on core NATS: %v", err)
					}
				}
				want := map[string]string{
					"Idempotency-Key":                  "k0",
					consumer.HeaderDeadLetterReason:    "permanent_error",
					consumer.HeaderDeadLetterHandler:   "h",
					consumer.HeaderDeadLetterAttempts:  "1",
					consumer.HeaderDeadLetterTransport: "nats",
					consumer.HeaderDeadLetterTopic:     e.stream,
					consumer.HeaderDeadLetterSubject:   e.subj + ".0",
					consumer.HeaderDeadLetterOffset:    "1",
				}
				for k, v := range want {
					if got := dl.Header.Get(k); got != v {
						t.Errorf("header %s = %q, want %q", k, got, v)
					}
				}
				if got := dl.Header.Get(consumer.HeaderDeadLetterError); !strings.Contains(got, "boom") {
					t.Errorf("error header %q", got)
				}
				if string(dl.Data) != "m0" || dl.Subject != dlSubj {
					t.Errorf("dead letter %s %q", dl.Subject, dl.Data)
				}
			})
		})
	}
}

// TestDeadLetterLoopRefused: a dead-letter subject the consumer would read
// back is refused at start.
func TestDeadLetterLoopRefused(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		src := newSource(t, e, natssource.Config{DeadLetterSubject: e.subj + ".dlq"})
		r := run(t, dispatch.Config{}, src, consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil }))
		err := r.Wait(t, 10*time.Second)
		if err == nil || !strings.Contains(err.Error(), "consumed again") {
			t.Errorf("Run = %v, want the dead-letter loop refused", err)
		}
	})
}

// TestNoDeadLetterConfigured: DeadLetter reports ErrNoDeadLetter.
func TestNoDeadLetterConfigured(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		e.publish(t, 1)
		got := make(chan error, 1)
		proc := func(string, consumer.Handler) consumer.Processor {
			return consumer.ProcessorFunc(func(ctx context.Context, d consumer.Delivery) {
				got <- d.DeadLetter(ctx, consumer.DeadLetter{Reason: "x"})
				_ = d.Ack(ctx)
			})
		}
		run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), consumer.HandlerFunc(nil), dispatch.WithProcessor(proc))
		select {
		case err := <-got:
			if !errors.Is(err, consumer.ErrNoDeadLetter) {
				t.Errorf("DeadLetter = %v, want ErrNoDeadLetter", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("not delivered")
		}
	})
}

// TestGoneIsAnError: a missing or deleted stream or consumer ends Run with
// an error naming both.
func TestGoneIsAnError(t *testing.T) {
	idle := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })
	check := func(t *testing.T, err error, e *env, target error) {
		t.Helper()
		if !errors.Is(err, target) || !strings.Contains(err.Error(), e.stream) || !strings.Contains(err.Error(), `"c"`) {
			t.Errorf("Run = %v, want %v naming stream %s and consumer c", err, target, e.stream)
		}
	}
	t.Run("missing stream", func(t *testing.T) {
		forEachServer(t, func(t *testing.T, e *env) {
			src := newSource(t, e, natssource.Config{Stream: e.stream + "_NONE"})
			err := run(t, dispatch.Config{}, src, idle).Wait(t, 10*time.Second)
			if !errors.Is(err, jetstream.ErrStreamNotFound) || !strings.Contains(err.Error(), e.stream+"_NONE") {
				t.Errorf("Run = %v", err)
			}
		})
	})
	t.Run("bind only", func(t *testing.T) {
		forEachServer(t, func(t *testing.T, e *env) {
			err := run(t, dispatch.Config{}, newSource(t, e, natssource.Config{BindOnly: true}), idle).Wait(t, 10*time.Second)
			check(t, err, e, jetstream.ErrConsumerNotFound)
		})
	})
	for _, what := range []string{"stream", "consumer"} {
		t.Run("deleted "+what, func(t *testing.T) {
			forEachServer(t, func(t *testing.T, e *env) {
				e.publish(t, 3)
				s := newSeen()
				h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
					s.add(string(m.Payload), 0)
					return nil, nil
				})
				r := run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), h)
				testenv.Eventually(t, 10*time.Second, "the 3 messages handled", func() bool { return s.count() == 3 })
				ctx := ctxT(t, 5*time.Second)
				var err error
				target := jetstream.ErrConsumerNotFound
				if what == "stream" {
					err = e.js.DeleteStream(ctx, e.stream)
					target = jetstream.ErrStreamNotFound
				} else {
					err = e.js.DeleteConsumer(ctx, e.stream, "c")
				}
				if err != nil {
					t.Fatal(err)
				}
				err = r.Wait(t, 15*time.Second)
				check(t, err, e, target)
			})
		})
	}
}

// TestShutdownInFlight: on cancel, handlers that finish within the drain are
// acked, those cancelled by the drain timeout are not, and Run returns nil.
// A second worker then receives exactly the unfinished messages.
func TestShutdownInFlight(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		e.publish(t, 4)
		started := make(chan string, 4)
		release := make(chan struct{})
		h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			started <- string(m.Payload)
			switch string(m.Payload) {
			case "m0", "m1": // finish during the drain
				<-release
				return nil, nil
			default: // never finish: cancelled by the drain timeout
				<-ctx.Done()
				return nil, context.Cause(ctx)
			}
		})
		// The long FetchMaxWait keeps the first worker's last pull
		// request waiting on the server after the worker stopped, when
		// m2 and m3 are nakked: a server before 2.10.16 loses a nak's
		// redelivery to such a request unless the Source made the
		// server drop it first.
		src := newSource(t, e, natssource.Config{AckWait: 30 * time.Second, FetchMaxWait: 20 * time.Second})
		r := run(t, dispatch.Config{ShutdownTimeout: 500 * time.Millisecond}, src, h, dispatch.WithConcurrency(4))
		for range 4 {
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("handlers did not start")
			}
		}
		r.Cancel()
		close(release)
		if err := r.Wait(t, 10*time.Second); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		// The second worker sees exactly m2 and m3 (nakked by the cancelled
		// processor), not m0 and m1 (acked).
		s := newSeen()
		h2 := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			s.add(string(m.Payload), 0)
			return nil, nil
		})
		run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), h2, dispatch.WithConcurrency(4))
		e.drained(t, "c", 15*time.Second)
		if s.count() != 2 || len(s.get("m2")) != 1 || len(s.get("m3")) != 1 {
			t.Errorf("second worker handled %v, want m2 and m3 once", s.runs)
		}
	})
}

// TestSecondConsumeRefused: one Source feeds one handler.
func TestSecondConsumeRefused(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		src := newSource(t, e, natssource.Config{})
		idle := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })
		run(t, dispatch.Config{}, src, idle)
		testenv.EventuallyNil(t, 10*time.Second, "the consumer created", func() error {
			_, err := e.js.Consumer(ctxT(t, 5*time.Second), e.stream, "c")
			return err
		})
		err := run(t, dispatch.Config{}, src, idle).Wait(t, 10*time.Second)
		if err == nil || !strings.Contains(err.Error(), "already consuming") {
			t.Errorf("second Run = %v", err)
		}
	})
}

// TestRequestReply: Request carries an inbox through the stream, and Reply
// answers it from the handler.
func TestRequestReply(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		src := newSource(t, e, natssource.Config{})
		h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			return nil, src.Reply(ctx, m, append([]byte("re:"), m.Payload...))
		})
		run(t, dispatch.Config{}, src, h)
		msg := nats.NewMsg(e.subj + ".req")
		msg.Data = []byte("hello")
		reply, err := natssource.Request(ctxT(t, 10*time.Second), e.js, msg)
		if err != nil {
			t.Fatal(err)
		}
		if string(reply.Data) != "re:hello" {
			t.Errorf("reply %q", reply.Data)
		}
		if err := natssource.Reply(t.Context(), e.nc, &consumer.Message{}, nil); !errors.Is(err, natssource.ErrNoReplySubject) {
			t.Errorf("Reply without header = %v", err)
		}
	})
}

// TestMaxAckPendingOverride: Config.MaxAckPending replaces the concurrency
// as the created consumer's MaxAckPending (several workers on one consumer).
func TestMaxAckPendingOverride(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		idle := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })
		run(t, dispatch.Config{}, newSource(t, e, natssource.Config{MaxAckPending: 48}), idle, dispatch.WithConcurrency(16))
		e.drained(t, "c", 10*time.Second)
		if got := e.consumerInfo(t, "c").Config.MaxAckPending; got != 48 {
			t.Errorf("MaxAckPending %d, want 48", got)
		}
	})
}
