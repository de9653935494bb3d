package kafkasource_test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// generations records the member id of every generation a source starts
// (its "generation started" log record), and passes records on.
type generations struct {
	slog.Handler
	mu      *sync.Mutex
	members *[]string
}

func (h generations) Enabled(context.Context, slog.Level) bool { return true }

func (h generations) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "generation started" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "member" {
				h.mu.Lock()
				*h.members = append(*h.members, a.Value.String())
				h.mu.Unlock()
			}
			return true
		})
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h generations) WithAttrs(as []slog.Attr) slog.Handler {
	return generations{Handler: h.Handler.WithAttrs(as), mu: h.mu, members: h.members}
}

func (h generations) WithGroup(name string) slog.Handler {
	return generations{Handler: h.Handler.WithGroup(name), mu: h.mu, members: h.members}
}

// TestDrainHeartbeats: a member whose handlers run longer than the session
// timeout drains for longer than that when a rebalance begins, and kafka-go
// sends no heartbeat meanwhile. Real Kafka removes a member that sends
// nothing for session.timeout.ms, also while the group prepares a
// rebalance; the source's keeper heartbeats for it, so the member keeps its
// id through the rebalance instead of rejoining as a new member (one more
// rebalance). KAFKA_TEST_NO_KEEPER=1 runs it without the keeper, which
// fails it.
func TestDrainHeartbeats(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	var msgs []msg
	for i := range 40 {
		msgs = append(msgs, msg{partition: i % 2, value: "x"})
	}
	e.produce(e.topic, msgs)
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		select {
		case <-time.After(3 * time.Second): // longer than the session timeout
		case <-ctx.Done():
		}
		return nil, nil
	})
	var mu sync.Mutex
	var aGens, bGens []string
	src := func(members *[]string) *kafkasource.Source {
		s := e.source(func(c *kafkasource.Config) {
			c.Logger = slog.New(generations{Handler: testenv.Logger(t).Handler(), mu: &mu, members: members})
			c.SessionTimeout = time.Second
			c.HeartbeatInterval = 100 * time.Millisecond
			c.RebalanceTimeout = 10 * time.Second
			c.RevokeTimeout = 5 * time.Second
		})
		if os.Getenv("KAFKA_TEST_NO_KEEPER") == "1" {
			kafkasource.DisableKeeper(s)
		}
		return s
	}
	count := func(members *[]string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(*members)
	}
	a := run(t, worker(t, "a", src(&aGens), h, dispatch.WithConcurrency(2)))
	testenv.Eventually(t, 30*time.Second, "a's first generation", func() bool { return count(&aGens) == 1 })
	b := run(t, worker(t, "b", src(&bGens), h, dispatch.WithConcurrency(2)))
	testenv.Eventually(t, 60*time.Second, "a generation with both members", func() bool { return count(&aGens) >= 2 && count(&bGens) >= 1 })
	mu.Lock()
	got := append([]string(nil), aGens...)
	mu.Unlock()
	for _, m := range got[1:] {
		if m != got[0] {
			t.Errorf("member a rejoined as a new member after draining (ids %v): the coordinator removed it while it drained", got)
			break
		}
	}
	for _, r := range []*testenv.Running{a, b} {
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	}
}
