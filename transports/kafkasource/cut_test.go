package kafkasource_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestRecoversFromCutsAndRebalances: a three-member group on real Kafka
// whose broker connections are cut again and again (through a proxy on the
// broker's advertised CUT listener) while members leave and join and one
// dies with its JoinGroup held (the chaos driver's kafka-cut, kill and
// term), with a session timeout of 2s as in the chaos run. Afterwards the
// group must settle and every message, those produced before and after the
// faults, must be handled. KAFKA_TEST_NO_KEEPER=1 runs it without the
// source's group keeper (see group.go), to measure what the keeper is for.
func TestRecoversFromCutsAndRebalances(t *testing.T) {
	const parts = 3
	bootstrap, cut := testenv.KafkaCut(t)
	brokers := testenv.RealKafka(t)
	topic := fmt.Sprintf("cuts-%d", time.Now().UnixNano())
	testenv.CreateKafkaTopic(t, brokers, topic, parts)
	e := &env{t: t, brokers: []string{bootstrap}, topic: topic, group: topic + "-g", parts: parts}
	noKeeper := os.Getenv("KAFKA_TEST_NO_KEEPER") == "1"

	var mu sync.Mutex
	seen := map[[2]int64]bool{}
	handled := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		d := 2 * time.Millisecond // work, so that cuts hit running handlers
		if m.Origin.Offset%40 == 7 {
			// Slow: a rebalance waits for it up to RevokeTimeout, so the
			// members rejoin seconds apart, as in the chaos run.
			d = 2500 * time.Millisecond
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		mu.Lock()
		seen[[2]int64{int64(m.Origin.Partition), m.Origin.Offset}] = true
		mu.Unlock()
		return nil, nil
	})
	var gaveUp atomic.Int64
	cfg := func(c *kafkasource.Config) {
		c.Logger = slog.New(joinTimeouts{Handler: testenv.Logger(t).Handler(), n: &gaveUp})
		c.SessionTimeout = 2 * time.Second
		c.HeartbeatInterval = 100 * time.Millisecond
		c.RebalanceTimeout = 4 * time.Second
		c.RevokeTimeout = 3 * time.Second
		c.NetworkTimeout = time.Second
	}
	start := func() *testenv.Running {
		src := e.source(cfg)
		if noKeeper {
			kafkasource.DisableKeeper(src)
		}
		return run(t, worker(t, "cuts", src, h, dispatch.WithConcurrency(4)))
	}

	produce := func(from, n int) {
		var msgs []msg
		for i := from; i < from+n; i++ {
			msgs = append(msgs, msg{partition: i % parts, value: strconv.Itoa(i)})
		}
		e.produce(topic, msgs)
	}
	const batch = 300
	produce(0, batch)

	members := []*testenv.Running{start(), start(), start()}
	testenv.Eventually(t, 30*time.Second, "the group consumes", func() bool { return handled() > 0 })

	// Faults, paced by a ticker: connection cuts, a member killed while
	// its JoinGroup is held (a ghost), members leaving and joining.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := range 8 {
		<-tick.C
		switch i % 4 {
		case 0:
			cut.Cut()
		case 1:
			killWhileJoining(t, brokers, e.group, topic, 4)
		case 2, 3:
			old := members[0]
			members = append(members[1:], start())
			go old.Cancel()
		}
	}
	faultsEnd := time.Now()
	produce(batch, batch)

	// Within a bound, the group forms again and consumes everything.
	total := 2 * batch
	deadline := time.Now().Add(40 * time.Second)
	for handled() < total {
		if time.Now().After(deadline) {
			t.Fatalf("the group did not recover: %d of %d messages handled %v after the last cut", handled(), total, time.Since(faultsEnd).Round(time.Second))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("every message handled %v after the last cut", time.Since(faultsEnd).Round(100*time.Millisecond))
	// A JoinGroup the coordinator held was given up: the member joined
	// again as a new one, restarting every other member's wait.
	if n := gaveUp.Load(); n > 0 {
		t.Errorf("members gave up %d JoinGroups held by the coordinator (i/o timeout)", n)
	}
	for _, m := range members {
		if err := m.Stop(t, 30*time.Second); err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	}
}

// joinTimeouts counts the source's logs of a JoinGroup that ended in a
// timeout, and passes every record on.
type joinTimeouts struct {
	slog.Handler
	n *atomic.Int64
}

func (h joinTimeouts) Enabled(context.Context, slog.Level) bool { return true }

func (h joinTimeouts) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "joining the group failed; retrying" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" && strings.Contains(a.Value.String(), "i/o timeout") {
				h.n.Add(1)
			}
			return true
		})
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h joinTimeouts) WithAttrs(as []slog.Attr) slog.Handler {
	return joinTimeouts{Handler: h.Handler.WithAttrs(as), n: h.n}
}

func (h joinTimeouts) WithGroup(name string) slog.Handler {
	return joinTimeouts{Handler: h.Handler.WithGroup(name), n: h.n}
}

// killWhileJoining starts a kafka-go group member that dies (as with kill -9:
// its connections close, it never dials again, it never leaves) once the
// coordinator holds its JoinGroup, while the group waits for the members
// to rejoin. The coordinator keeps such a member until its session times out
// (Kafka) or, on a coordinator that gives an undelivered JoinGroup reply no
// session timer, until the rebalance timeout passes.
func killWhileJoining(t *testing.T, brokers []string, group, topic string, members int) {
	t.Helper()
	var (
		mu    sync.Mutex
		conns []net.Conn
		dead  bool
	)
	d := &kafka.Dialer{Timeout: 2 * time.Second, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if dead {
			return nil, errors.New("ghost: killed")
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			conns = append(conns, c)
		}
		return c, err
	}}
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{ID: group, Brokers: brokers, Dialer: d, Topics: []string{topic},
		SessionTimeout: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond, RebalanceTimeout: 4 * time.Second,
		Timeout: 2 * time.Second, JoinGroupBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cg.Close() })
	// Held: the group prepares a rebalance and lists the new member.
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 2 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := cl.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		cancel()
		if err == nil && len(resp.Groups) == 1 && resp.Groups[0].GroupState == "PreparingRebalance" && len(resp.Groups[0].Members) >= members {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	dead = true
	for _, c := range conns {
		_ = c.Close()
	}
	mu.Unlock()
}
