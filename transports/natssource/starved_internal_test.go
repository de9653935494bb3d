package natssource

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/bytebudget"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// namedRunner is a Runner that only has a name; its other methods are the
// embedded nil interface's.
type namedRunner struct{ consumer.Runner }

func (namedRunner) Name() string { return "h" }

// openSub stands for an open subscription: checkStarved only asks whether
// there is one.
type openSub struct{ jetstream.ConsumeContext }

// TestCheckStarved: the warning comes on the starvedTicks-th idle tick in
// a row that finds messages the server should be sending, once, and never
// while something explains the silence: no slot held for a message, the
// byte bound waited on, the consumer paused, at its MaxAckPending or under
// a priority policy, nothing pending, no subscription open, no info.
func TestCheckStarved(t *testing.T) {
	st := testenv.NewNATSStream(t, testenv.NATS(t), "STARVED")
	const warning = "sent none to this worker"
	starving := func() *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{NumPending: 3, NumAckPending: 1, Delivered: jetstream.SequenceInfo{Stream: 7}, Config: jetstream.ConsumerConfig{MaxAckPending: 4, MaxRequestMaxBytes: 2048}}
	}
	cases := []struct {
		name  string
		setup func(l *consumeLoop, info *jetstream.ConsumerInfo)
		warn  bool
	}{
		{"starved", func(*consumeLoop, *jetstream.ConsumerInfo) {}, true},
		{"no info", nil, false},
		{"every slot in calls", func(l *consumeLoop, _ *jetstream.ConsumerInfo) { l.held = false }, false},
		{"waiting for the byte bound", func(l *consumeLoop, _ *jetstream.ConsumerInfo) {
			l.buf.Take(1 << 20)
			done := make(chan struct{})
			go func() { defer close(done); _ = l.buf.Acquire(t.Context(), 1) }()
			t.Cleanup(func() { <-done }) // t.Context ends before the cleanups run
			testenv.Eventually(t, 10*time.Second, "a waiter", func() bool { _, _, w := l.buf.State(); return w == 1 })
		}, false},
		{"paused", func(_ *consumeLoop, i *jetstream.ConsumerInfo) { i.Paused = true }, false},
		{"at MaxAckPending", func(_ *consumeLoop, i *jetstream.ConsumerInfo) { i.NumAckPending = 4 }, false},
		{"priority policy", func(_ *consumeLoop, i *jetstream.ConsumerInfo) {
			i.Config.PriorityPolicy = jetstream.PriorityPolicyPinned
		}, false},
		{"nothing pending", func(_ *consumeLoop, i *jetstream.ConsumerInfo) { i.NumPending = 0 }, false},
		{"no subscription", func(l *consumeLoop, _ *jetstream.ConsumerInfo) { l.rc.cc = nil }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			logs := &testenv.SyncBuffer{}
			s, err := New(st.JS, Config{Stream: st.Name, Consumer: "c", Logger: slog.New(slog.NewTextHandler(logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			buf := bytebudget.New(1 << 20)
			rc := newReceiver(s, nil, buf, 1, 1)
			rc.cc, rc.pullBytes = openSub{}, 2048
			l := &consumeLoop{s: s, r: namedRunner{}, n: 2, batch: 2, buf: buf, rc: rc, held: true}
			var info *jetstream.ConsumerInfo
			if c.setup != nil {
				info = starving()
				c.setup(l, info)
			}
			for tick := 1; tick <= starvedTicks+2; tick++ {
				l.checkStarved(info)
				got := strings.Count(logs.String(), warning)
				want := 0
				if c.warn && tick >= starvedTicks {
					want = 1
				}
				if got != want {
					t.Fatalf("after idle tick %d: %d warnings, want %d; logs:\n%s", tick, got, want, logs)
				}
			}
			if c.warn {
				for _, f := range []string{"num_pending=3", "pull_max_bytes=2048", "max_request_max_bytes=2048", "max_payload=", "delivered_stream_seq=7"} {
					if !strings.Contains(logs.String(), f) {
						t.Errorf("the warning lacks %s:\n%s", f, logs)
					}
				}
			}
		})
	}
}
