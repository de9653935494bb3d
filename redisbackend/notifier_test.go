package redisbackend

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// namedStore returns a store on its own client whose connections carry a
// unique client name, so the test can find its Pub/Sub connection.
func namedStore(t *testing.T) (*Store, string) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	name := "dedup-notifier-" + testenv.RandID()
	opt.ClientName = name
	client := redis.NewClient(opt)
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(client, Options{Namespace: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, name
}

func claimOne(t *testing.T, s *Store, key string) *idempotency.Claim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: key, Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Minute}})
	if err != nil || res[0].Outcome != idempotency.ClaimNew {
		t.Fatalf("Claim(%s) = %+v, %v", key, res, err)
	}
	t.Cleanup(func() { _, _ = s.client.Del(context.Background(), s.RedisKey(key)).Result() })
	return res[0].Claim
}

func (n *notifier) isReady() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.readyClosed
}

// pubsubConns returns the ids of the Pub/Sub connections named name.
func pubsubConns(t *testing.T, admin *redis.Client, name string) []string {
	t.Helper()
	list, err := admin.Do(context.Background(), "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for line := range strings.Lines(list) {
		if !strings.Contains(line, " name="+name+" ") {
			continue
		}
		for f := range strings.FieldsSeq(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

func TestCloseStopsSubscriberAndWaiters(t *testing.T) {
	s, _ := namedStore(t)
	claimOne(t, s, "k")
	done := make(chan error, 1)
	go func() {
		_, err := s.Wait(context.Background(), "k", time.Minute)
		done <- err
	}()
	testenv.Eventually(t, 5*time.Second, "subscriber ready", s.notify.isReady)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.notify.done:
	default:
		t.Fatal("Close returned before the subscriber goroutine ended")
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Wait interrupted by Close = %v, want ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a Wait in progress did not end at Close")
	}
	if _, err := s.Wait(context.Background(), "k", time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after Close = %v, want ErrClosed", err)
	}
}

func TestCloseWithoutWaitStartsNothing(t *testing.T) {
	s, _ := namedStore(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.notify.mu.Lock()
	started := s.notify.started
	s.notify.mu.Unlock()
	if started {
		t.Error("a Store that never waited started a subscriber")
	}
}

// One Pub/Sub connection serves every waiter of a Store, and a killed
// connection is replaced: notifications flow again.
func TestSubscriberSharedAndRestarted(t *testing.T) {
	s, name := namedStore(t)
	admin := testenv.RedisClient(t).(*redis.Client)
	claimOne(t, s, "a")
	claimOne(t, s, "b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, k := range []string{"a", "a", "b"} {
		go func() { _, _ = s.Wait(ctx, k, time.Minute) }()
	}
	testenv.Eventually(t, 5*time.Second, "subscriber ready", s.notify.isReady)
	ids := pubsubConns(t, admin, name)
	if len(ids) != 1 {
		t.Fatalf("%d Pub/Sub connections for three waiters on one Store, want 1", len(ids))
	}
	if err := admin.Do(context.Background(), "CLIENT", "KILL", "ID", ids[0]).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "a new subscription after the kill", func() bool {
		now := pubsubConns(t, admin, name)
		return len(now) == 1 && now[0] != ids[0] && s.notify.isReady()
	})
	// Notifications reach waiters through the new connection.
	c := claimOne(t, s, "c")
	got := make(chan time.Time, 1)
	go func() {
		rec, err := s.Wait(ctx, "c", 10*time.Second)
		if err == nil && rec != nil && rec.State == idempotency.StateCompleted {
			got <- time.Now()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("Wait returned before Complete")
	case <-time.After(1600 * time.Millisecond): // let the re-reads back off to ~1s apart
	}
	at := time.Now()
	ok, err := s.Complete(context.Background(), []idempotency.Completion{{Key: "c", Token: c.Token, Outcome: "ok", Retention: time.Minute}})
	if err != nil || !ok[0] {
		t.Fatalf("Complete = %v, %v", ok, err)
	}
	select {
	case woke, ok := <-got:
		if !ok {
			t.Fatal("Wait did not return the completed record")
		}
		if lat := woke.Sub(at); lat > 300*time.Millisecond {
			t.Errorf("woken %s after Complete: the restarted subscription does not deliver", lat)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return")
	}
}

// A Redis restart (scripts and data gone, every connection cut) fails calls
// with ErrStoreUnavailable while it is down; afterwards the store works
// again without help: scripts reload on NOSCRIPT and the subscriber
// resubscribes, so notifications wake waiters again.
func TestStoreSurvivesRestart(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	opt.DialerRetries = 1
	client := redis.NewClient(opt)
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(client, Options{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	claimOne(t, s, "before")
	if _, err := s.Wait(ctx, "before", 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "subscriber ready", s.notify.isReady)

	srv.Stop()
	if _, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: "down", Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Minute}}); !errors.Is(err, idempotency.ErrStoreUnavailable) {
		t.Errorf("Claim while Redis is down = %v, want ErrStoreUnavailable", err)
	}
	testenv.Eventually(t, 10*time.Second, "subscriber to notice the lost connection", func() bool { return !s.notify.isReady() })

	srv.Start()
	testenv.Eventually(t, 10*time.Second, "Ping after the restart", func() bool { return s.Ping(ctx) == nil })
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{
		{Key: "after:1", Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Minute},
		{Key: "after:2", Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Minute},
	})
	if err != nil || res[0].Outcome != idempotency.ClaimNew || res[1].Outcome != idempotency.ClaimNew {
		t.Fatalf("Claim after the restart (empty script cache) = %+v, %v", res, err)
	}
	testenv.Eventually(t, 15*time.Second, "subscriber back after the restart", s.notify.isReady)
	done := make(chan *idempotency.Record, 1)
	go func() {
		rec, _ := s.Wait(ctx, "after:1", 10*time.Second)
		done <- rec
	}()
	select {
	case rec := <-done:
		t.Fatalf("Wait returned before Complete: %+v", rec)
	case <-time.After(1600 * time.Millisecond): // let the re-reads back off to ~1s apart
	}
	at := time.Now()
	ok, err := s.Complete(ctx, []idempotency.Completion{{Key: "after:1", Token: res[0].Claim.Token, Outcome: "ok", Retention: time.Minute}})
	if err != nil || !ok[0] {
		t.Fatalf("Complete after the restart = %v, %v", ok, err)
	}
	select {
	case rec := <-done:
		if rec == nil || rec.State != idempotency.StateCompleted {
			t.Fatalf("Wait = %+v", rec)
		}
		if lat := time.Since(at); lat > 300*time.Millisecond {
			t.Errorf("woken %s after Complete: notifications do not flow after the restart", lat)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return")
	}
}
