package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/idempotency/idempotencytest"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// renewalResults sends every lease-renewal result.
type renewalResults chan string

func (r renewalResults) OnLeaseRenewal(_, result string) { r <- result }

// The engine sends a running handler's lease renewals when its Clock says
// they are due (a third of the lease, give or take a tenth), not before, and none once the
// handler returned. The renewals themselves go to real Redis.
func TestEngineRenewsOnItsClock(t *testing.T) {
	store, err := redisbackend.New(testenv.RedisClient(t), redisbackend.Options{Namespace: testenv.RandID()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	clock := idempotencytest.NewClock(time.Time{})
	renewals := make(renewalResults, 16)
	eng, err := idempotency.New(store, idempotency.Config{Clock: clock, Hooks: consumer.Hooks{renewals}, StoreTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const lease = 3 * time.Second // renewed every 1s ±100ms, scanned every 30ms
	mw, err := eng.Processor(idempotency.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	p := mw("orders", consumer.HandlerFunc(func(ctx context.Context, _ *consumer.Message) ([]byte, error) {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, ctx.Err()
	}))
	d := consumertest.NewDelivery(consumertest.NewMessage("k-"+testenv.RandID(), "pay"), 1)
	processed := make(chan struct{})
	go func() {
		defer close(processed)
		p.Process(context.Background(), d)
	}()
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	wait(started, "the handler to start")

	clock.Advance(870 * time.Millisecond) // the last scan before the earliest due time
	select {
	case r := <-renewals:
		t.Fatalf("renewal %q before it was due", r)
	default:
	}
	clock.Advance(260 * time.Millisecond) // past the latest due time and its scan
	select {
	case r := <-renewals:
		if r != "ok" {
			t.Fatalf("renewal result %q, want ok", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal once it was due")
	}

	close(release)
	wait(processed, "Process to return")
	if st, _ := d.Settled(); st != consumertest.Acked {
		t.Fatalf("delivery %s, want acked", st)
	}
	clock.Advance(time.Minute)
	select {
	case r := <-renewals:
		t.Fatalf("renewal %q after the handler returned", r)
	default:
	}
	if n := clock.Timers(); n != 0 {
		t.Fatalf("%d timers armed with no handler running, want 0", n)
	}
}
