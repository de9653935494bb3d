package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pollEvery is how often Eventually looks again.
const pollEvery = 10 * time.Millisecond

// Eventually fails t, naming what it waited for, unless cond holds within
// the given time. It polls cond every 10ms, so it is for conditions with
// nothing to wait on (another process's or a broker's state); where the code
// under test signals, wait on the signal instead.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyNil(t, within, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

var errNotYet = errors.New("condition not met")

// EventuallyNil fails t unless check returns nil within the given time, with
// what it waited for and check's last error, so that the error can say how
// far things got ("3 of 10 handled"). It polls like Eventually.
func EventuallyNil(t testing.TB, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	poll := time.NewTicker(pollEvery)
	defer poll.Stop()
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			if err == errNotYet {
				t.Fatalf("not within %s: %s", within, what)
			}
			t.Fatalf("not within %s: %s: %v", within, what, err)
		}
		<-poll.C
	}
}

// RandID returns 8 random hex digits, to name the streams, topics, groups
// and namespaces of one test apart from every other run's.
func RandID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails: crypto/rand.Read crashes the program instead
	return hex.EncodeToString(b)
}

// UniqueName returns prefix_<test>_<RandID()>, where <test> is the last 40
// characters of t's name with every character but letters, digits, '_' and
// '-' turned into '_': a name that tells which test made a NATS stream, a
// Kafka topic or a Redis namespace, unique to this run, and valid as each
// (nats-server 2.9 loses the acks of a stream whose name holds a '%').
func UniqueName(t testing.TB, prefix string) string {
	name := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, t.Name())
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return prefix + "_" + name + "_" + RandID()
}

// FreePort returns a loopback TCP port that nothing listened on a moment
// ago, for a server the test starts.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreeAddr is FreePort as a host:port on 127.0.0.1.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// FreePorts returns n distinct free loopback TCP ports (see FreePort).
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := freePorts(n)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return ports
}

// freePorts is FreePorts without a test.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	ports := make([]int, 0, n)
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Logger returns a logger that writes to t's log, which go test shows for a
// failed test or under -v: records of level Warn and above, or of every
// level when the environment sets DEDUP_TEST_LOG=debug. What is logged
// after the test has ended is dropped, so that a goroutine still shutting
// down cannot log into a finished test (which panics).
func Logger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if strings.EqualFold(os.Getenv("DEDUP_TEST_LOG"), "debug") {
		level = slog.LevelDebug
	}
	w := &testWriter{t: t}
	t.Cleanup(w.end)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: dropTime}))
}

// dropTime leaves the time out of a record: the test log has its own order.
func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

// testWriter writes each record to a test's log until the test ends.
type testWriter struct {
	t     testing.TB
	mu    sync.Mutex
	ended bool
}

var _ io.Writer = (*testWriter)(nil)

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) end() {
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
}
