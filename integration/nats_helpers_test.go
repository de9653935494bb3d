package integration_test

// Helpers of the NATS integration tests. Every name starts with "nats" so
// the tests of other transports in this package cannot collide with them.

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// natsEachServer runs f against the system nats-server and an embedded
// current one, in parallel.
func natsEachServer(t *testing.T, f func(t *testing.T, h *natsHarness)) {
	t.Helper()
	testenv.EachNATSServer(t, func(t *testing.T, url string) { f(t, newNATSHarness(t, url)) })
}

// natsHarness is one test's NATS stream and Redis namespace.
type natsHarness struct {
	url      string
	nc       *nats.Conn
	js       jetstream.JetStream
	stream   string
	subj     string
	ns       string // Redis namespace
	redisURL string
	redis    redis.UniversalClient
}

func newNATSHarness(t testing.TB, url string) *natsHarness {
	t.Helper()
	s := testenv.NewNATSStream(t, url, "IT", natsReconnect...)
	h := &natsHarness{url: url, redisURL: testenv.Redis(t), redis: testenv.RedisClient(t),
		nc: s.Conn, js: s.JS, stream: s.Name, subj: s.Subject, ns: "it-" + testenv.RandID()}
	testenv.DropNamespace(t, h.ns)
	return h
}

// natsReconnect reconnects every 100ms, with no limit on the attempts.
var natsReconnect = []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}

// natsConnect is testenv.NATSConnect with natsReconnect.
func natsConnect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return testenv.NATSConnect(t, url, natsReconnect...)
}

func (h *natsHarness) createStream(t testing.TB, name string, subjects ...string) {
	t.Helper()
	testenv.CreateStream(t, h.js, name, subjects...)
}

// natsPlan is what a test publishes: one message per entry, keyed.
type natsPlan []string

// natsPlanWithDuplicates returns unique keys k0…k<unique-1> and dups more
// entries repeating random earlier keys, shuffled with a fixed seed.
func natsPlanWithDuplicates(unique, dups int) natsPlan {
	r := mrand.New(mrand.NewPCG(1, 2))
	p := make(natsPlan, 0, unique+dups)
	for i := range unique {
		p = append(p, fmt.Sprintf("k%d", i))
	}
	for range dups {
		p = append(p, p[r.IntN(unique)])
	}
	r.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

func (p natsPlan) unique() int {
	m := map[string]bool{}
	for _, k := range p {
		m[k] = true
	}
	return len(m)
}

// publish publishes each key of p as its own message on <subj>.orders with
// the Idempotency-Key header and the payload "order <key>".
func (h *natsHarness) publish(t testing.TB, p natsPlan) {
	t.Helper()
	ctx := natsCtx(t, 60*time.Second)
	for start := 0; start < len(p); start += 1000 {
		futs := make([]jetstream.PubAckFuture, 0, 1000)
		for _, key := range p[start:min(start+1000, len(p))] {
			m := nats.NewMsg(h.subj + ".orders")
			m.Data = []byte("order " + key)
			m.Header.Set("Idempotency-Key", key)
			f, err := h.js.PublishMsgAsync(m)
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publish: %v", err)
			case <-ctx.Done():
				t.Fatal("publish: no stream ack")
			}
		}
	}
}

func (h *natsHarness) consumerInfo(t testing.TB, name string) (*jetstream.ConsumerInfo, error) {
	ctx := natsCtx(t, 5*time.Second)
	c, err := h.js.Consumer(ctx, h.stream, name)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// drained waits until the consumer acked all of the n messages of the
// stream: nothing pending, nothing awaiting an ack, ack floor at n.
func (h *natsHarness) drained(t testing.TB, name string, n uint64, timeout time.Duration) {
	t.Helper()
	testenv.EventuallyNil(t, timeout, "consumer "+name+" drained", func() error {
		info, err := h.consumerInfo(t, name)
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 || info.AckFloor.Stream != n {
			return fmt.Errorf("pending %d, ack pending %d, redelivered %d, ack floor %d of %d",
				info.NumPending, info.NumAckPending, info.NumRedelivered, info.AckFloor.Stream, n)
		}
		return nil
	})
}

func natsCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// natsLedger records what handlers did, per key.
type natsLedger struct {
	runCounts
	fences    map[string][]int64
	reclaimed map[string]bool
}

func newNATSLedger() *natsLedger {
	return &natsLedger{runCounts: newRunCounts(), fences: map[string][]int64{}, reclaimed: map[string]bool{}}
}

func (l *natsLedger) start(ctx context.Context) string {
	ci, _ := dedupworker.ClaimOf(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.starts[ci.Key]++
	l.fences[ci.Key] = append(l.fences[ci.Key], ci.Fence)
	if ci.Reclaimed {
		l.reclaimed[ci.Key] = true
	}
	return ci.Key
}

func (l *natsLedger) complete(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.completes[key]++
}

// handler is a handler that records its runs and completes at once.
func (l *natsLedger) handler() consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		key := l.start(ctx)
		l.complete(key)
		return []byte("done " + key), nil
	})
}

// slowHandler records its runs like handler, calls started as each run
// starts and works for work before it completes; when its context ends
// first it returns the context's cause, without completing.
func (l *natsLedger) slowHandler(work time.Duration, started func()) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		key := l.start(ctx)
		started()
		select {
		case <-time.After(work):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		l.complete(key)
		return nil, nil
	})
}

// natsWorkerSpec describes one worker of a test.
type natsWorkerSpec struct {
	js          jetstream.JetStream   // default: the harness's
	redis       redis.UniversalClient // default: the harness's
	consumer    string                // default "c"
	concurrency int                   // default 8
	ackWait     time.Duration         // default 30s
	dlq         string
	shutdown    time.Duration
	handler     consumer.Handler
	hooks       consumer.Hooks
	opts        []idempotency.Option
}

// natsRunning is a Worker.Run in progress.
type natsRunning struct {
	*testenv.Running
	src *natssource.Source
}

// start runs a deduplicating worker with one handler named "orders".
func (h *natsHarness) start(t testing.TB, spec natsWorkerSpec) *natsRunning {
	t.Helper()
	if spec.js == nil {
		spec.js = h.js
	}
	if spec.redis == nil {
		spec.redis = h.redis
	}
	if spec.consumer == "" {
		spec.consumer = "c"
	}
	if spec.concurrency == 0 {
		spec.concurrency = 8
	}
	log := testenv.Logger(t)
	store, err := redisbackend.New(spec.redis, redisbackend.Options{Namespace: h.ns, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	eng, err := idempotency.New(store, idempotency.Config{Logger: log, Hooks: spec.hooks, StoreTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dedup, err := eng.Processor(append([]idempotency.Option{idempotency.WithRetention(10 * time.Minute)}, spec.opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	src, err := natssource.New(spec.js, natssource.Config{
		Stream: h.stream, Consumer: spec.consumer, AckWait: spec.ackWait, DeadLetterSubject: spec.dlq,
		FetchMaxWait: 200 * time.Millisecond, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	w := dispatch.NewWorker(dispatch.Config{Logger: log, Hooks: spec.hooks, ShutdownTimeout: spec.shutdown})
	if err := w.Handle("orders", src, spec.handler, dispatch.WithConcurrency(spec.concurrency), dispatch.WithProcessor(dedup)); err != nil {
		t.Fatal(err)
	}
	return &natsRunning{Running: testenv.Go(t, w.Run), src: src}
}

// proxiedRedis returns a client to Redis through a new proxy.
func (h *natsHarness) proxiedRedis(t testing.TB) (redis.UniversalClient, *testenv.Proxy) {
	t.Helper()
	opt, err := redis.ParseURL(h.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, opt.Addr)
	opt.Addr = p.Addr()
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 500*time.Millisecond, time.Second, time.Second
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c, p
}

// natsStore returns a Store on the harness's namespace for inspecting
// records.
func natsStore(t testing.TB, h *natsHarness) *redisbackend.Store {
	t.Helper()
	s, err := redisbackend.New(h.redis, redisbackend.Options{Namespace: h.ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
