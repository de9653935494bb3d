package natssource_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// forEachServer runs f as a subtest against every NATS server the tests use
// (docs/TESTING.md).
func forEachServer(t *testing.T, f func(t *testing.T, e *env)) {
	t.Helper()
	testenv.EachNATSServer(t, func(t *testing.T, url string) { f(t, newEnv(t, url)) })
}

// env is one test's connection and its own stream.
type env struct {
	url    string
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string // also the subject prefix, lowercased
	subj   string
}

func newEnv(t *testing.T, url string) *env {
	t.Helper()
	s := testenv.NewNATSStream(t, url, "T")
	return &env{url: url, nc: s.Conn, js: s.JS, stream: s.Name, subj: s.Subject}
}

func (e *env) createStream(t *testing.T, name string, subjects ...string) {
	t.Helper()
	testenv.CreateStream(t, e.js, name, subjects...)
}

// publish publishes n messages "m<i>" on <subj>.<i%3>, each with header
// Idempotency-Key k<i>, and waits for their stream acks.
func (e *env) publish(t *testing.T, n int) {
	t.Helper()
	e.publishEach(t, 30*time.Second, n, func(i int) *nats.Msg {
		m := nats.NewMsg(fmt.Sprintf("%s.%d", e.subj, i%3))
		m.Data = fmt.Appendf(nil, "m%d", i)
		m.Header.Set("Idempotency-Key", fmt.Sprintf("k%d", i))
		return m
	})
}

// publishEach publishes the n messages msg builds, asynchronously, and
// waits up to timeout for all their stream acks.
func (e *env) publishEach(t *testing.T, timeout time.Duration, n int, msg func(i int) *nats.Msg) {
	t.Helper()
	ctx := ctxT(t, timeout)
	futs := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		f, err := e.js.PublishMsgAsync(msg(i))
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

func (e *env) consumerInfo(t *testing.T, name string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx := ctxT(t, 5*time.Second)
	c, err := e.js.Consumer(ctx, e.stream, name)
	if err != nil {
		t.Fatalf("consumer %s: %v", name, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	return info
}

// drained waits until the consumer has delivered and settled everything.
func (e *env) drained(t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	testenv.EventuallyNil(t, timeout, "consumer "+name+" drained", func() error {
		ctx := ctxT(t, 5*time.Second)
		c, err := e.js.Consumer(ctx, e.stream, name)
		if err != nil { // not created yet
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 || info.NumRedelivered != 0 {
			return fmt.Errorf("pending %d, ack pending %d, redelivered %d", info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		if info.Delivered.Stream == 0 {
			// nats-server registers a new consumer before it counts what
			// is pending for it, and reports 0 pending meanwhile: a
			// consumer that has delivered nothing is drained only when
			// its stream holds nothing.
			st, err := e.js.Stream(ctx, e.stream)
			if err != nil {
				return err
			}
			if n := st.CachedInfo().State.Msgs; n > 0 {
				return fmt.Errorf("nothing delivered yet of the stream's %d messages", n)
			}
		}
		return nil
	})
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// run starts a worker with one handler on src and returns a handle; the
// test's cleanup stops it if the test did not.
func run(t *testing.T, cfg dispatch.Config, src consumer.Source, h consumer.Handler, opts ...dispatch.HandleOption) *testenv.Running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testenv.Logger(t)
	}
	w := dispatch.NewWorker(cfg)
	if err := w.Handle("h", src, h, opts...); err != nil {
		t.Fatal(err)
	}
	return testenv.Go(t, w.Run)
}

// seen records handler runs by payload.
type seen struct {
	mu   sync.Mutex
	runs map[string][]int // payload -> attempts (from the source's Attempt via the recorder processor) or run counts
	n    int
}

func newSeen() *seen { return &seen{runs: map[string][]int{}} }

func (s *seen) add(payload string, attempt int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs[payload] = append(s.runs[payload], attempt)
	s.n++
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *seen) get(payload string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.runs[payload]...)
}

// tempDir is a directory for the Example's embedded server, removed by
// TestMain.
func tempDir() string {
	exampleDirOnce.Do(func() {
		d, err := os.MkdirTemp("", "natstr-example-")
		if err != nil {
			panic(err)
		}
		exampleDir = d
	})
	return exampleDir
}

var (
	exampleDirOnce sync.Once
	exampleDir     string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if exampleDir != "" {
		_ = os.RemoveAll(exampleDir)
	}
	os.Exit(code)
}
