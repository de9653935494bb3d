package redisbackend

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// numSub is the number of connections subscribed to channel.
func numSub(t *testing.T, admin redis.UniversalClient, channel string) int64 {
	t.Helper()
	m, err := admin.PubSubNumSub(context.Background(), channel).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[channel]
}

// stopped reports whether no run goroutine is running: the latest has
// returned, and none was started since (or the notifier is closed).
func (n *notifier) stopped() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.done:
		return !n.started || n.closed
	default:
		return false
	}
}

// A notifier without waiters unsubscribes after its idle period, and the
// next Wait subscribes again and is woken by the notification. The poll is
// set to a minute, so only a notification wakes a Wait within the test.
func TestNotifierIdleUnsubscribesAndResubscribes(t *testing.T) {
	s, _ := namedStore(t)
	const idle = 200 * time.Millisecond
	s.notify.idle = idle
	s.floor, s.cap = time.Minute, time.Minute
	admin := testenv.RedisClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for round := range 3 {
		key := fmt.Sprintf("k%d", round)
		c := claimOne(t, s, key)
		got := make(chan *idempotency.Record, 1)
		go func() {
			rec, err := s.Wait(ctx, key, 20*time.Second)
			if err != nil {
				t.Errorf("round %d: Wait: %v", round, err)
			}
			got <- rec
		}()
		testenv.Eventually(t, 5*time.Second, fmt.Sprintf("round %d: one subscriber while a Wait waits", round), func() bool {
			return numSub(t, admin, s.channel) == 1 && s.notify.isReady()
		})
		// A waiter keeps the subscription through several idle periods.
		select {
		case rec := <-got:
			t.Fatalf("round %d: Wait returned before Complete: %+v", round, rec)
		case <-time.After(3 * idle):
		}
		if n := numSub(t, admin, s.channel); n != 1 {
			t.Fatalf("round %d: %d subscribers while a Wait waits, want 1", round, n)
		}
		at := time.Now()
		ok, err := s.Complete(ctx, []idempotency.Completion{{Key: key, Token: c.Token, Outcome: "ok", Retention: time.Minute}})
		if err != nil || !ok[0] {
			t.Fatalf("round %d: Complete = %v, %v", round, ok, err)
		}
		select {
		case rec := <-got:
			if rec == nil || rec.State != idempotency.StateCompleted {
				t.Fatalf("round %d: Wait = %+v, want the completed record", round, rec)
			}
			t.Logf("round %d: woken %s after Complete", round, time.Since(at))
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Wait not woken by the notification", round)
		}
		testenv.Eventually(t, 5*time.Second, fmt.Sprintf("round %d: unsubscribed and run ended after %s without waiters", round, idle), func() bool {
			return numSub(t, admin, s.channel) == 0 && s.notify.stopped()
		})
		if s.notify.isReady() {
			t.Fatalf("round %d: ready after the idle stop", round)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// countingHandler counts the notifier's idle stops and logs its warnings.
type countingHandler struct {
	t     *testing.T
	stops *atomic.Int64
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h countingHandler) WithGroup(string) slog.Handler            { return h }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	switch {
	case strings.Contains(r.Message, "unsubscribed"):
		h.stops.Add(1)
	case r.Level >= slog.LevelWarn:
		h.t.Log(r.Message)
	}
	return nil
}

// Waiters come and go while the notifier stops and restarts every few
// milliseconds and the channel is busy: each waiter that saw the
// subscription ready is woken by a publish of its key, and close ends every
// run goroutine.
func TestNotifierIdleChurnLosesNoWakeup(t *testing.T) {
	client := testenv.RedisClient(t)
	channel := "dedup-churn-" + testenv.RandID() + ":dedup:done"
	var stops atomic.Int64
	n := newNotifier(client, channel, slog.New(countingHandler{t: t, stops: &stops}))
	n.idle = time.Millisecond
	t.Cleanup(n.close)

	const workers = 8
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	until := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	var woken atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(until); i++ {
				key := fmt.Sprintf("w%d:%d", w, i)
				wake, ready, _ := n.watch(key)
				if i%3 == 0 {
					// Leave at once, maybe before the subscription is up.
					n.unwatch(key, wake)
					continue
				}
				select {
				case <-ready:
				case <-time.After(5 * time.Second):
					n.unwatch(key, wake)
					t.Errorf("%s: subscription not ready", key)
					return
				}
				if err := client.Publish(ctx, channel, key).Err(); err != nil {
					n.unwatch(key, wake)
					t.Error(err)
					return
				}
				select {
				case <-wake:
					woken.Add(1)
				case <-time.After(5 * time.Second):
					n.unwatch(key, wake)
					t.Errorf("%s: lost wake-up: published after the subscription was ready, not delivered", key)
					return
				}
				n.unwatch(key, wake)
				if ms := time.Now().UnixMilli(); ms/5%2 == 1 {
					// The quiet half of each 10ms: every worker sleeps to
					// its end, so the notifier goes idle, then comes back
					// at a slightly different time, racing the restart.
					time.Sleep(time.Duration(5-ms%5)*time.Millisecond + time.Duration(i%4)*300*time.Microsecond)
				}
			}
		})
	}
	// Keep the channel busy, so idleness must be noticed between messages
	// and not only on a read timeout.
	wg.Go(func() {
		for time.Now().Before(until) {
			if err := client.Publish(ctx, channel, "noise").Err(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	t.Logf("%d wake-ups, %d idle stops", woken.Load(), stops.Load())
	if woken.Load() == 0 || stops.Load() < 10 {
		t.Fatalf("%d wake-ups, %d idle stops: the churn did not exercise stop and restart", woken.Load(), stops.Load())
	}

	closed := make(chan struct{})
	go func() {
		n.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not return: a run goroutine is left")
	}
	if !n.stopped() {
		t.Error("a run goroutine is running after close")
	}
	n.watch("after-close")
	if !n.stopped() {
		t.Error("watch after close started a run goroutine")
	}
}
