package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// fatalRecorder is a testing.TB whose Fatalf records the failure and ends
// the goroutine, as testing.T's does, without failing the real test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failure runs f with a fatalRecorder on a goroutine of its own and returns
// the failure message, empty when f did not fail.
func failure(t *testing.T, f func(tb testing.TB)) string {
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.msg
}

func TestEventually(t *testing.T) {
	var n atomic.Int32
	if msg := failure(t, func(tb testing.TB) {
		testenv.Eventually(tb, 5*time.Second, "the third look", func() bool { return n.Add(1) >= 3 })
	}); msg != "" || n.Load() != 3 {
		t.Fatalf("a condition that holds at the third look: failure %q after %d looks", msg, n.Load())
	}
	start := time.Now()
	msg := failure(t, func(tb testing.TB) {
		testenv.Eventually(tb, 50*time.Millisecond, "the impossible", func() bool { return false })
	})
	if !strings.Contains(msg, "the impossible") || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("a condition that never holds: failure %q after %s, want one naming it after 50ms", msg, time.Since(start))
	}
	msg = failure(t, func(tb testing.TB) {
		testenv.EventuallyNil(tb, 30*time.Millisecond, "progress", func() error { return errors.New("2 of 5 done") })
	})
	if !strings.Contains(msg, "progress") || !strings.Contains(msg, "2 of 5 done") {
		t.Fatalf("EventuallyNil failure %q, want what and the last error", msg)
	}
}

func TestRandIDAndFreePorts(t *testing.T) {
	a, b := testenv.RandID(), testenv.RandID()
	if len(a) != 8 || a == b {
		t.Fatalf("RandID gave %q and %q: want two different 8-digit ids", a, b)
	}
	if n := testenv.UniqueName(t, "T"); !strings.HasPrefix(n, "T_TestRandIDAndFreePorts_") || len(n) != len("T_TestRandIDAndFreePorts_")+8 {
		t.Fatalf("UniqueName = %q", n)
	}
	t.Run("a%b/c d", func(t *testing.T) {
		if n := testenv.UniqueName(t, "T"); strings.ContainsAny(n, "%/ ") || n == testenv.UniqueName(t, "T") {
			t.Fatalf("UniqueName = %q: want only letters, digits, _ and -, and a new name each call", n)
		}
	})
	ports := testenv.FreePorts(t, 3)
	if ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] || testenv.FreePort(t) <= 0 {
		t.Fatalf("FreePorts gave %v", ports)
	}
}

// Logger writes to the test's log and drops what comes after the test.
func TestLoggerAfterTheTest(t *testing.T) {
	var log func()
	t.Run("inner", func(t *testing.T) {
		l := testenv.Logger(t)
		l.Warn("shown with the test")
		log = func() { l.Warn("after the test") }
	})
	log() // would panic if it reached the finished subtest's log
}

// A private server with args, a directory and persistence keeps its data
// across Stop and Start; a TLS one answers only over TLS.
func TestRedisServerRestartAndTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "redis")
	s := testenv.NewRedisServer(t, testenv.RedisServerConfig{Dir: dir, Args: []string{"--appendonly", "yes", "--appendfsync", "always"}})
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Start()
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("after a restart with an append-only file: %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "appendonlydir")); err != nil {
		t.Fatalf("no append-only file in Dir: %v", err)
	}

	ca := testenv.NewTestCA(t)
	tlsSrv := testenv.NewRedisServer(t, testenv.RedisServerConfig{TLS: ca})
	if err := tlsSrv.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}
	if !strings.HasPrefix(tlsSrv.URL(), "rediss://") {
		t.Fatalf("TLS server URL %s", tlsSrv.URL())
	}
	plain := redis.NewClient(&redis.Options{Addr: tlsSrv.Addr(), DialTimeout: 500 * time.Millisecond, MaxRetries: -1})
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	defer pcancel()
	if err := plain.Ping(pctx).Err(); err == nil {
		t.Fatal("a TLS-only server answered PING in plain text")
	}
}

// Go's call sees its context cancelled by Stop, and Stop and Wait return
// its result; Wait without a cancel times out, failing the test.
func TestGo(t *testing.T) {
	errStopped := errors.New("stopped")
	r := testenv.Go(t, func(ctx context.Context) error {
		<-ctx.Done()
		return errStopped
	})
	if msg := failure(t, func(tb testing.TB) { _ = r.Wait(tb, 20*time.Millisecond) }); !strings.Contains(msg, "did not return") {
		t.Fatalf("Wait on a call that blocks: failure %q", msg)
	}
	select {
	case <-r.Done():
		t.Fatal("Done closed before Stop")
	default:
	}
	if err := r.Stop(t, 5*time.Second); !errors.Is(err, errStopped) {
		t.Fatalf("Stop = %v, want the call's result", err)
	}
	if err := r.Wait(t, time.Second); !errors.Is(err, errStopped) {
		t.Fatalf("Wait after Stop = %v", err)
	}
}

func TestDropNamespaceDeletesOnlyItsOwnKeys(t *testing.T) {
	client := testenv.RedisClient(t)
	ctx := context.Background()
	ns, other := "drop-"+testenv.RandID(), "keep-"+testenv.RandID()
	keep := other + ":k"
	if err := client.Set(ctx, keep, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Del(ctx, keep) })
	t.Run("writes", func(t *testing.T) {
		testenv.DropNamespace(t, ns)
		for i := range 2500 { // more than one SCAN batch
			if err := client.Set(ctx, fmt.Sprintf("%s:k-%d", ns, i), "v", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if n, err := client.Keys(ctx, ns+":*").Result(); err != nil || len(n) != 0 {
		t.Fatalf("after the cleanup, %d keys of %s are left (%v)", len(n), ns, err)
	}
	if n, err := client.Exists(ctx, keep).Result(); err != nil || n != 1 {
		t.Fatalf("another namespace's key is gone (%d, %v)", n, err)
	}
}
