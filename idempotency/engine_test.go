package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

type fixture struct {
	store idempotency.Store
	eng   *idempotency.Engine
	oc    *outcomes
	calls *storeCalls
}

// storeCalls counts store calls by op.
type storeCalls struct{ claim, complete atomic.Int32 }

func (s *storeCalls) OnStoreCall(op string, _ time.Duration, _ error) {
	switch op {
	case "claim":
		s.claim.Add(1)
	case "complete":
		s.complete.Add(1)
	}
}

func newFixture(t *testing.T, client redis.UniversalClient) *fixture {
	t.Helper()
	store, err := redisbackend.New(client, redisbackend.Options{Namespace: "enginetest-" + testenv.RandID(), Grace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f := &fixture{store: store, oc: &outcomes{}, calls: &storeCalls{}}
	f.eng, err = idempotency.New(store, idempotency.Config{Hooks: consumer.Hooks{f.oc, f.calls}, StoreTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// privateFixture is a fixture on a private redis-server started with args
// (see testenv.RedisServerConfig.Args), for tests that stop it: its client
// fails fast while the server is down.
func privateFixture(t *testing.T, args ...string) (*fixture, *testenv.RedisServer) {
	t.Helper()
	srv := testenv.StartRedisServer(t, args...)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	return newFixture(t, client), srv
}

func setup(t *testing.T) *fixture {
	t.Helper()
	return newFixture(t, testenv.RedisClient(t))
}

func (f *fixture) processor(t *testing.T, h consumer.Handler, opts ...idempotency.Option) consumer.Processor {
	t.Helper()
	dedup, err := f.eng.Processor(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return dedup("orders", h)
}

func TestDuplicateAckedWithoutRunningHandler(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var replayed []byte
	h := &countingHandler{}
	p := f.processor(t, h, idempotency.WithOnDuplicate(func(_ context.Context, _ consumer.Delivery, rec *idempotency.Record) error {
		replayed = rec.Result
		return nil
	}))
	ctx := context.Background()

	d1 := consumertest.NewDelivery(consumertest.NewMessage("k1", "payload"), 1)
	p.Process(ctx, d1)
	d1.ExpectAcked(t)
	d2 := consumertest.NewDelivery(consumertest.NewMessage("k1", "payload"), 1)
	p.Process(ctx, d2)
	d2.ExpectAcked(t)

	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if string(replayed) != "ok:payload" {
		t.Fatalf("OnDuplicate got result %q, want the stored %q", replayed, "ok:payload")
	}
	if f.oc.get(consumer.OutcomeProcessed) != 1 || f.oc.get(consumer.OutcomeDuplicate) != 1 {
		t.Fatalf("outcomes %v, want one processed and one duplicate", f.oc.m)
	}
	rec, err := f.store.Get(ctx, idempotency.EffectiveKey("orders", "k1"))
	if err != nil || rec == nil || rec.State != idempotency.StateCompleted || rec.Outcome != idempotency.RecordOutcomeOK {
		t.Fatalf("record = %+v, %v; want COMPLETED ok", rec, err)
	}
}

func TestHandlerErrorReleasesAndNaksWithBackoff(t *testing.T) {
	t.Parallel()
	f := setup(t)
	fail := atomic.Bool{}
	fail.Store(true)
	var fences []int64
	h := &countingHandler{fn: func(ctx context.Context, _ *consumer.Message) ([]byte, error) {
		ci, _ := dedupworker.ClaimOf(ctx)
		fences = append(fences, ci.Fence)
		if fail.Load() {
			return nil, errBoom
		}
		return nil, nil
	}}
	p := f.processor(t, h, idempotency.WithBackoff(time.Second, time.Minute))
	ctx := context.Background()

	d1 := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Process(ctx, d1)
	delay := d1.ExpectNakked(t)
	if delay < 800*time.Millisecond || delay > 1200*time.Millisecond {
		t.Fatalf("nak delay %s, want the first backoff step 1s ±20%%", delay)
	}
	rec, err := f.store.Get(ctx, idempotency.EffectiveKey("orders", "k"))
	if err != nil || rec == nil || !rec.Released {
		t.Fatalf("after a failure the claim must be released, record = %+v, err %v", rec, err)
	}

	// The redelivery claims at once (no waiting for the lease) and runs again.
	fail.Store(false)
	d2 := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 2)
	p.Process(ctx, d2)
	d2.ExpectAcked(t)
	if h.runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", h.runs.Load())
	}
	if len(fences) != 2 || fences[1] <= fences[0] {
		t.Fatalf("fences %v: the second owner must get a higher fence", fences)
	}
}

func TestRetryAfterOverridesBackoff(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.processor(t, &countingHandler{fn: func(context.Context, *consumer.Message) ([]byte, error) {
		return nil, dispatch.RetryAfter(7*time.Second, nil)
	}})
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Process(context.Background(), d)
	if got := d.ExpectNakked(t); got != 7*time.Second {
		t.Fatalf("nak delay %s, want the handler's 7s", got)
	}
}

func TestMaxAttemptsDeadLettersAndCompletes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{fn: func(context.Context, *consumer.Message) ([]byte, error) { return nil, errBoom }}
	p := f.processor(t, h, idempotency.WithMaxAttempts(3), idempotency.WithBackoff(time.Millisecond, time.Millisecond))
	ctx := context.Background()

	for attempt := 1; attempt <= 2; attempt++ {
		d := consumertest.NewDelivery(consumertest.NewMessage("poison", "x"), attempt)
		p.Process(ctx, d)
		d.ExpectNakked(t)
	}
	d3 := consumertest.NewDelivery(consumertest.NewMessage("poison", "x"), 3)
	p.Process(ctx, d3)
	dl := d3.ExpectDeadLettered(t)
	if dl.Reason != "max_attempts" || dl.Attempts != 3 || dl.Key != "poison" || dl.Handler != "orders" || dl.Err != errBoom.Error() {
		t.Fatalf("dead letter %+v: want reason max_attempts, 3 attempts, key, handler and error", dl)
	}
	rec, err := f.store.Get(ctx, idempotency.EffectiveKey("orders", "poison"))
	if err != nil || rec == nil || rec.State != idempotency.StateCompleted || rec.Outcome != idempotency.RecordOutcomeDeadLettered {
		t.Fatalf("record %+v, %v: want COMPLETED dead_lettered", rec, err)
	}
	// A later redelivery is acked without running.
	d4 := consumertest.NewDelivery(consumertest.NewMessage("poison", "x"), 1)
	p.Process(ctx, d4)
	d4.ExpectAcked(t)
	if h.runs.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", h.runs.Load())
	}
	if f.oc.get(consumer.OutcomeDeadLettered) != 1 || f.oc.get(consumer.OutcomeFailed) != 2 {
		t.Fatalf("outcomes %v", f.oc.m)
	}
}

func TestAttemptsCountedPerKeyAcrossDeliveries(t *testing.T) {
	t.Parallel()
	// A transport that cannot count (Attempt always 1) still dead-letters
	// after max attempts: the record counts runs.
	f := setup(t)
	h := &countingHandler{fn: func(context.Context, *consumer.Message) ([]byte, error) { return nil, errBoom }}
	p := f.processor(t, h, idempotency.WithMaxAttempts(2), idempotency.WithBackoff(time.Millisecond, time.Millisecond))
	d1 := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Process(context.Background(), d1)
	d1.ExpectNakked(t)
	d2 := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Process(context.Background(), d2)
	if dl := d2.ExpectDeadLettered(t); dl.Attempts != 2 {
		t.Fatalf("dead letter %+v, want one after 2 attempts", dl)
	}
}

func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{fn: func(context.Context, *consumer.Message) ([]byte, error) {
		return nil, dispatch.Permanent(errors.New("bad order"))
	}}
	p := f.processor(t, h)
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Process(context.Background(), d)
	if dl := d.ExpectDeadLettered(t); dl.Reason != "permanent_error" {
		t.Fatalf("dead letter %+v, want reason permanent_error", dl)
	}
}

func TestDeadLetterPublishFailureIsRetriedNotAcked(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{fn: func(context.Context, *consumer.Message) ([]byte, error) { return nil, dispatch.Permanent(errBoom) }}
	p := f.processor(t, h)
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	d.FailWith(consumertest.Errors{DeadLetter: errors.New("broker down")})
	p.Process(context.Background(), d)
	d.ExpectNakked(t)
	rec, err := f.store.Get(context.Background(), idempotency.EffectiveKey("orders", "k"))
	if err != nil || rec == nil || rec.State != idempotency.StateClaimed || !rec.Released {
		t.Fatalf("record %+v, %v: an unpublished dead letter must leave the key released, not completed", rec, err)
	}
}

func TestNoDeadLetterDestinationStillCompletes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{fn: func(context.Context, *consumer.Message) ([]byte, error) { return nil, dispatch.Permanent(errBoom) }}
	p := f.processor(t, h)
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	d.FailWith(consumertest.Errors{DeadLetter: consumer.ErrNoDeadLetter})
	p.Process(context.Background(), d)
	d.ExpectAcked(t)
	rec, _ := f.store.Get(context.Background(), idempotency.EffectiveKey("orders", "k"))
	if rec == nil || rec.Outcome != idempotency.RecordOutcomeDeadLettered {
		t.Fatalf("record %+v: want dead_lettered even without a destination", rec)
	}
}

func TestLongHandlerIsRenewedHeartbeatsAndRunsOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const lease = 300 * time.Millisecond
	started := make(chan struct{})
	h := &countingHandler{fn: func(ctx context.Context, _ *consumer.Message) ([]byte, error) {
		close(started)
		select { // the work itself: 3× the lease
		case <-time.After(3 * lease):
			return []byte("done"), nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}}
	p := f.processor(t, h, idempotency.WithLease(lease), idempotency.WithInFlightWait(10*lease))
	ctx := context.Background()
	d1 := consumertest.NewDelivery(consumertest.NewMessage("long", "x"), 1)
	done := make(chan struct{})
	go func() { defer close(done); p.Process(ctx, d1) }()
	<-started

	// A redelivery of the same key meanwhile waits for the first and is
	// acked as a duplicate.
	d2 := consumertest.NewDelivery(consumertest.NewMessage("long", "x"), 1)
	p.Process(ctx, d2)
	<-done
	d1.ExpectAcked(t)
	d2.ExpectAcked(t)
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if hb := d1.Heartbeats(); hb < 2 {
		t.Fatalf("%d heartbeats during 3 leases, want at least 2 (one per renewal)", hb)
	}
	if f.oc.get(consumer.OutcomeProcessed) != 1 || f.oc.get(consumer.OutcomeDuplicate) != 1 {
		t.Fatalf("outcomes %v", f.oc.m)
	}
}

func TestInFlightKeyIsNakkedAfterTheWait(t *testing.T) {
	t.Parallel()
	f := setup(t)
	started, finish := make(chan struct{}), make(chan struct{})
	h := &countingHandler{fn: func(context.Context, *consumer.Message) ([]byte, error) {
		close(started)
		<-finish
		return nil, nil
	}}
	p := f.processor(t, h, idempotency.WithInFlightWait(100*time.Millisecond))
	d1 := consumertest.NewDelivery(consumertest.NewMessage("busy", "x"), 1)
	done := make(chan struct{})
	go func() { defer close(done); p.Process(context.Background(), d1) }()
	<-started
	d2 := consumertest.NewDelivery(consumertest.NewMessage("busy", "x"), 1)
	p.Process(context.Background(), d2)
	if delay := d2.ExpectNakked(t); delay <= 0 {
		t.Fatalf("an in-flight key must be redelivered later, got delay %s", delay)
	}
	close(finish)
	<-done
	d1.ExpectAcked(t)
	if h.runs.Load() != 1 || f.oc.get(consumer.OutcomeInFlight) != 1 {
		t.Fatalf("runs %d outcomes %v: want one run and one in_flight", h.runs.Load(), f.oc.m)
	}
}

func TestStolenLeaseCancelsHandlerWithErrLeaseLost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const lease = 300 * time.Millisecond
	started := make(chan struct{})
	cause := make(chan error, 1)
	h := &countingHandler{fn: func(ctx context.Context, _ *consumer.Message) ([]byte, error) {
		close(started)
		select {
		case <-ctx.Done():
			cause <- context.Cause(ctx)
			return nil, ctx.Err()
		case <-time.After(10 * lease):
			cause <- nil
			return nil, nil
		}
	}}
	p := f.processor(t, h, idempotency.WithLease(lease))
	d := consumertest.NewDelivery(consumertest.NewMessage("stolen", "x"), 1)
	done := make(chan struct{})
	go func() { defer close(done); p.Process(context.Background(), d) }()
	<-started
	// Another owner takes the key: the record is replaced under our feet.
	// (A record that merely vanishes has no new owner: that is redelivered,
	// see integration TestHostileRecordGoneUnderHandler.)
	other := `{"v":1,"state":"CLAIMED","fp":"1:x","fpv":1,"token":"another-owner","fence":2,"claimed_at_ms":1,"lease_until_ms":99999999999999,"attempts":2}`
	rkey := f.store.(*redisbackend.Store).RedisKey(idempotency.EffectiveKey("orders", "stolen"))
	if err := testenv.RedisClient(t).Set(context.Background(), rkey, other, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := <-cause; !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("handler context cause = %v, want ErrLeaseLost", err)
	}
	d.ExpectAcked(t)
	if f.oc.get(consumer.OutcomeLeaseLost) != 1 {
		t.Fatalf("outcomes %v, want lease_lost", f.oc.m)
	}
}

func TestPanicIsRecoveredAsFailure(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{fn: func(context.Context, *consumer.Message) ([]byte, error) { panic("kaboom") }}
	p := f.processor(t, h)
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Process(context.Background(), d)
	d.ExpectNakked(t)
	if f.oc.get(consumer.OutcomeFailed) != 1 {
		t.Fatalf("outcomes %v, want failed", f.oc.m)
	}
}

func TestStepsSkipFinishedStepsOnRetry(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var charges, emails atomic.Int32
	failEmail := atomic.Bool{}
	failEmail.Store(true)
	h := &countingHandler{fn: func(ctx context.Context, _ *consumer.Message) ([]byte, error) {
		receipt, err := dedupworker.Step(ctx, "charge", func(context.Context) ([]byte, error) {
			return []byte("receipt-" + strconv.Itoa(int(charges.Add(1)))), nil
		})
		if err != nil {
			return nil, err
		}
		_, err = dedupworker.Step(ctx, "email", func(context.Context) ([]byte, error) {
			emails.Add(1)
			if failEmail.Load() {
				return nil, errors.New("smtp down")
			}
			return nil, nil
		})
		return receipt, err
	}}
	p := f.processor(t, h, idempotency.WithBackoff(time.Millisecond, time.Millisecond))
	d1 := consumertest.NewDelivery(consumertest.NewMessage("order-1", "x"), 1)
	p.Process(context.Background(), d1)
	d1.ExpectNakked(t)

	failEmail.Store(false)
	d2 := consumertest.NewDelivery(consumertest.NewMessage("order-1", "x"), 1)
	p.Process(context.Background(), d2)
	d2.ExpectAcked(t)
	if charges.Load() != 1 || emails.Load() != 2 {
		t.Fatalf("charge ran %d times (want 1), email %d (want 2)", charges.Load(), emails.Load())
	}
	rec, _ := f.store.Get(context.Background(), idempotency.EffectiveKey("orders", "order-1"))
	if rec == nil || string(rec.Result) != "receipt-1" {
		t.Fatalf("stored result %+v: want the first charge's receipt", rec)
	}
}

func TestMissingKeyPolicies(t *testing.T) {
	t.Parallel()
	f := setup(t)
	t.Run("reject", func(t *testing.T) {
		h := &countingHandler{}
		p := f.processor(t, h)
		d := consumertest.NewDelivery(consumertest.NewMessage("", "x"), 1)
		p.Process(context.Background(), d)
		if dl := d.ExpectDeadLettered(t); dl.Reason != "missing_key" || h.runs.Load() != 0 {
			t.Fatalf("dead letter %+v runs %d: want missing_key and no run", dl, h.runs.Load())
		}
	})
	t.Run("passthrough", func(t *testing.T) {
		h := &countingHandler{}
		p := f.processor(t, h, idempotency.WithMissingKey(idempotency.MissingKeyPassthrough))
		for range 2 {
			d := consumertest.NewDelivery(consumertest.NewMessage("", "x"), 1)
			p.Process(context.Background(), d)
			d.ExpectAcked(t)
		}
		if h.runs.Load() != 2 || f.oc.get(consumer.OutcomePassthrough) != 2 {
			t.Fatalf("runs %d outcomes %v: want 2 passthrough runs", h.runs.Load(), f.oc.m)
		}
	})
	t.Run("json-not-json", func(t *testing.T) {
		h := &countingHandler{}
		p := f.processor(t, h, idempotency.WithKeySources(idempotency.JSONKey("id")))
		d := consumertest.NewDelivery(consumertest.NewMessage("", "not json {"), 1)
		p.Process(context.Background(), d)
		if dl := d.ExpectDeadLettered(t); dl.Reason != "missing_key" {
			t.Fatalf("a non-JSON payload with a json: source is a missing key, got %+v", dl)
		}
	})
}

func TestFingerprintMismatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{}
	p := f.processor(t, h)
	ctx := context.Background()
	d1 := consumertest.NewDelivery(consumertest.NewMessage("k", "original"), 1)
	p.Process(ctx, d1)
	d1.ExpectAcked(t)
	d2 := consumertest.NewDelivery(consumertest.NewMessage("k", "different content"), 1)
	p.Process(ctx, d2)
	if dl := d2.ExpectDeadLettered(t); dl.Reason != "fingerprint_mismatch" {
		t.Fatalf("want a fingerprint_mismatch dead letter, got %+v", dl)
	}
	if h.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", h.runs.Load())
	}
	rec, _ := f.store.Get(ctx, idempotency.EffectiveKey("orders", "k"))
	if rec == nil || string(rec.Result) != "ok:original" {
		t.Fatalf("the stored record must be untouched, got %+v", rec)
	}

	ig := f.processor(t, h, idempotency.WithMismatch(idempotency.MismatchIgnore))
	d3 := consumertest.NewDelivery(consumertest.NewMessage("k", "different content"), 1)
	ig.Process(ctx, d3)
	d3.ExpectAcked(t)
	if h.runs.Load() != 1 {
		t.Fatalf("mismatch: ignore must ack as a duplicate")
	}
}

func TestShadowModeRunsButCountsWouldSkip(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{}
	p := f.processor(t, h, idempotency.WithShadow())
	for range 3 {
		d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
		p.Process(context.Background(), d)
		d.ExpectAcked(t)
	}
	if h.runs.Load() != 3 {
		t.Fatalf("shadow mode ran the handler %d times, want 3", h.runs.Load())
	}
	if f.oc.get(consumer.OutcomeWouldSkip) != 2 || f.oc.get(consumer.OutcomeProcessed) != 1 {
		t.Fatalf("outcomes %v: want 1 processed, 2 would_skip", f.oc.m)
	}
}

func TestPrepareClaimsInOneCall(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{}
	p := f.processor(t, h)
	var batch []consumer.Delivery
	for i := range 20 {
		batch = append(batch, consumertest.NewDelivery(consumertest.NewMessage(fmt.Sprintf("k%d", i%12), "x"), 1)) // 8 duplicates
	}
	p.Prepare(context.Background(), batch)
	if n := f.calls.claim.Load(); n != 1 {
		t.Fatalf("%d claim calls for one batch, want 1", n)
	}
	for _, d := range batch {
		p.Process(context.Background(), d)
		d.(*consumertest.Delivery).ExpectAcked(t)
	}
	if h.runs.Load() != 12 {
		t.Fatalf("handler ran %d times for 12 unique keys", h.runs.Load())
	}
}

func TestCancelledBeforeRunReleasesAndNaks(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{}
	p := f.processor(t, h)
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Prepare(context.Background(), []consumer.Delivery{d})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.Process(ctx, d)
	if delay := d.ExpectNakked(t); delay != 0 {
		t.Fatalf("a cancelled delivery must be nakked for immediate redelivery, got delay %s", delay)
	}
	rec, _ := f.store.Get(context.Background(), idempotency.EffectiveKey("orders", "k"))
	if rec == nil || !rec.Released || h.runs.Load() != 0 {
		t.Fatalf("record %+v runs %d: the prepared claim must be released without running", rec, h.runs.Load())
	}
}

func TestClaimInfoInContext(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var got dedupworker.Claim
	p := f.processor(t, &countingHandler{fn: func(ctx context.Context, _ *consumer.Message) ([]byte, error) {
		got, _ = dedupworker.ClaimOf(ctx)
		return nil, nil
	}})
	p.Process(context.Background(), consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, err := f.store.Get(ctx, "orders:k")
	if err != nil || rec == nil || rec.Fence < 1 {
		t.Fatalf("stored record %+v, %v: want one with a positive fence", rec, err)
	}
	want := dedupworker.Claim{Handler: "orders", Key: "k", EffectiveKey: "orders:k", Fence: rec.Fence, Attempt: 1}
	if got != want {
		t.Fatalf("claim info %+v, want %+v", got, want)
	}
}

func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	// Persistent, so that the claim made before the outage is there after it.
	f, srv := privateFixture(t, "--appendonly", "yes", "--appendfsync", "always")

	started := make(chan struct{})
	release := make(chan struct{})
	h := &countingHandler{fn: func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		if string(m.Payload) == "mid-run" {
			close(started)
			<-release
		}
		return []byte("done"), nil
	}}
	p := f.processor(t, h, idempotency.WithStoreRetry(100*time.Millisecond, time.Second))

	// Redis dies while a handler runs: the completion cannot be stored, so
	// the delivery is not acked, and its result is held while the
	// completion is tried again.
	d1 := consumertest.NewDelivery(consumertest.NewMessage("k1", "mid-run"), 1)
	done := make(chan struct{})
	go func() { defer close(done); p.Process(context.Background(), d1) }()
	<-started
	srv.Stop()
	close(release)

	// With Redis down, a new delivery runs nothing and acks nothing.
	d2 := consumertest.NewDelivery(consumertest.NewMessage("k2", "x"), 1)
	p.Process(context.Background(), d2)
	d2.ExpectNakked(t)
	testenv.Eventually(t, 20*time.Second, "the completion tried more than a few times", func() bool { return f.calls.complete.Load() >= 5 })
	d1.ExpectUnsettled(t)

	// Redis is back: the held result is stored and the delivery acked,
	// without running the handler again.
	srv.Start()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the held completion was not stored after the store came back")
	}
	d1.ExpectAcked(t)
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1: the one that finished during the outage", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, err := f.store.Get(ctx, "orders:k1")
	if err != nil || rec == nil || rec.State != idempotency.StateCompleted || string(rec.Result) != "done" {
		t.Fatalf("record %+v, %v: want k1 completed with the held result", rec, err)
	}
	if f.oc.get(consumer.OutcomeStoreError) != 1 || f.oc.get(consumer.OutcomeProcessed) != 1 {
		t.Fatalf("outcomes %v: want 1 store_error (k2) and 1 processed (k1)", f.oc.m)
	}
}

// A held completion is given back, not acked, when the delivery's context
// ends (the worker's drain deadline) before the store answers.
func TestHeldCompletionGivenBackWhenContextEnds(t *testing.T) {
	t.Parallel()
	f, srv := privateFixture(t)
	h := &countingHandler{fn: func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		srv.Stop()
		return nil, nil
	}}
	p := f.processor(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	done := make(chan struct{})
	go func() { defer close(done); p.Process(ctx, d) }()
	testenv.Eventually(t, 20*time.Second, "the completion tried again", func() bool { return f.calls.complete.Load() >= 2 })
	d.ExpectUnsettled(t)
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Process did not return after its context ended")
	}
	d.ExpectNakked(t)
	if f.oc.get(consumer.OutcomeStoreError) != 1 {
		t.Fatalf("outcomes %v: want 1 store_error", f.oc.m)
	}
}

// With Options.Durability against a Redis that has no replica, every claim
// falls short of its replicas: the store fails closed, so the
// handler never runs and the delivery is not acked but redelivered later.
func TestDurabilityShortfallRunsNothing(t *testing.T) {
	t.Parallel()
	store, err := redisbackend.New(testenv.RedisClient(t), redisbackend.Options{
		Namespace:  "enginetest-" + testenv.RandID(),
		Durability: redisbackend.Durability{Replicas: 1, Timeout: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f := &fixture{store: store, oc: &outcomes{}, calls: &storeCalls{}}
	f.eng, err = idempotency.New(store, idempotency.Config{Hooks: consumer.Hooks{f.oc, f.calls}, StoreTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h := &countingHandler{}
	p := f.processor(t, h, idempotency.WithStoreRetry(100*time.Millisecond, time.Second))
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Process(context.Background(), d)
	d.ExpectNakked(t)
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times on claims no replica acknowledged", n)
	}
	if f.oc.get(consumer.OutcomeStoreError) != 1 {
		t.Fatalf("outcomes %v: want 1 store_error", f.oc.m)
	}
}

func TestFailOpenBypassesStore(t *testing.T) {
	t.Parallel()
	f, srv := privateFixture(t)
	srv.Stop()
	h := &countingHandler{}
	p := f.processor(t, h, idempotency.WithFailOpen())
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Process(context.Background(), d)
	d.ExpectAcked(t)
	if h.runs.Load() != 1 || f.oc.get(consumer.OutcomeStoreBypassed) != 1 {
		t.Fatalf("fail_open: runs %d outcomes %v", h.runs.Load(), f.oc.m)
	}
}

func TestInvalidOptionsNameTheField(t *testing.T) {
	t.Parallel()
	f := setup(t)
	cases := map[string]idempotency.Option{
		"Lease":       idempotency.WithLease(time.Millisecond),
		"MaxAttempts": idempotency.WithMaxAttempts(0),
		"Backoff.Max": idempotency.WithBackoff(time.Minute, time.Second),
		"MissingKey":  idempotency.WithMissingKey("drop"),
		"KeySources":  idempotency.WithKeySources(),
	}
	for field, opt := range cases {
		_, err := f.eng.Processor(opt)
		if !errors.Is(err, idempotency.ErrInvalidOption) || !contains(err.Error(), field) {
			t.Errorf("%s: error %v, want ErrInvalidOption naming the field", field, err)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestDuplicateInBatchAdoptsTheHeldClaim(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := &countingHandler{}
	p := f.processor(t, h, idempotency.WithInFlightWait(200*time.Millisecond))
	first, second := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1), consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	p.Prepare(context.Background(), []consumer.Delivery{first, second})
	// The later copy runs first (another Kafka partition, another lane): it
	// must take over the claim made for the first, not wait for it.
	p.Process(context.Background(), second)
	second.ExpectAcked(t)
	p.Process(context.Background(), first)
	first.ExpectAcked(t)
	if h.runs.Load() != 1 || f.oc.get(consumer.OutcomeProcessed) != 1 || f.oc.get(consumer.OutcomeDuplicate) != 1 {
		t.Fatalf("runs %d outcomes %v: want one run, one duplicate", h.runs.Load(), f.oc.m)
	}
}

func TestCrashedOwnerIsReclaimedWhenItsLeaseEnds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// A worker claimed the key and died: nobody renews its 300ms lease.
	key := idempotency.EffectiveKey("orders", "k")
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "x"), 1)
	res, err := f.store.Claim(context.Background(), []idempotency.ClaimRequest{{
		Key: key, Fingerprint: idempotency.Fingerprint(d.Message(), nil), FingerprintVersion: idempotency.FingerprintVersion, Lease: 300 * time.Millisecond,
	}})
	if err != nil || res[0].Outcome != idempotency.ClaimNew {
		t.Fatalf("claim: %+v %v", res, err)
	}
	h := &countingHandler{}
	p := f.processor(t, h, idempotency.WithInFlightWait(time.Minute))
	start := time.Now()
	p.Process(context.Background(), d)
	d.ExpectAcked(t)
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("took %s: the expired lease must be reclaimed when it ends, not after the whole in-flight wait", took)
	}
	if h.runs.Load() != 1 || f.oc.get(consumer.OutcomeReclaimed) != 1 {
		t.Fatalf("runs %d outcomes %v: want one reclaimed run", h.runs.Load(), f.oc.m)
	}
}

func TestConcurrentCompletionsAreBatched(t *testing.T) {
	t.Parallel()
	f := setup(t)
	gate := make(chan struct{})
	h := &countingHandler{fn: func(context.Context, *consumer.Message) ([]byte, error) {
		<-gate
		return nil, nil
	}}
	p := f.processor(t, h)
	var batch []consumer.Delivery
	for i := range 64 {
		batch = append(batch, consumertest.NewDelivery(consumertest.NewMessage(fmt.Sprintf("k%d", i), "x"), 1))
	}
	p.Prepare(context.Background(), batch)
	done := make(chan struct{})
	for _, d := range batch {
		go func() { p.Process(context.Background(), d); done <- struct{}{} }()
	}
	for h.runs.Load() < 64 {
		runtime.Gosched()
	}
	close(gate) // 64 handlers finish at once
	for range batch {
		<-done
	}
	for _, d := range batch {
		d.(*consumertest.Delivery).ExpectAcked(t)
	}
	// Completions are coalesced: far fewer store calls than messages.
	if n := f.calls.complete.Load(); n > 16 {
		t.Fatalf("%d complete calls for 64 simultaneous completions, want them batched", n)
	}
	t.Logf("64 completions in %d store calls", f.calls.complete.Load())
}

// TestConcurrentRunsAreEachRenewed: the renewals of one handler's runs share
// a list and a timer; runs that end (short ones, in between) leave it
// without disturbing the others, and every long run is renewed and
// heartbeated on its own.
func TestConcurrentRunsAreEachRenewed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const lease = 300 * time.Millisecond
	h := &countingHandler{fn: func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		if !strings.HasPrefix(m.Header.Get("Idempotency-Key"), "long") {
			return nil, nil
		}
		select { // 3× the lease
		case <-time.After(3 * lease):
			return nil, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}}
	p := f.processor(t, h, idempotency.WithLease(lease))
	var long, short []*consumertest.Delivery
	var wg sync.WaitGroup
	for i := range 4 {
		d := consumertest.NewDelivery(consumertest.NewMessage(fmt.Sprintf("long%d", i), "x"), 1)
		long = append(long, d)
		wg.Go(func() { p.Process(context.Background(), d) })
		for j := range 5 {
			s := consumertest.NewDelivery(consumertest.NewMessage(fmt.Sprintf("short%d-%d", i, j), "x"), 1)
			short = append(short, s)
			p.Process(context.Background(), s)
		}
	}
	wg.Wait()
	for _, d := range short {
		d.ExpectAcked(t)
	}
	for i, d := range long {
		d.ExpectAcked(t)
		if hb := d.Heartbeats(); hb < 2 {
			t.Errorf("long%d: %d heartbeats during 3 leases, want at least 2 (one per renewal)", i, hb)
		}
	}
	if n := h.runs.Load(); n != int32(len(long)+len(short)) {
		t.Fatalf("handler ran %d times, want %d", n, len(long)+len(short))
	}
	if f.oc.get(consumer.OutcomeProcessed) != len(long)+len(short) {
		t.Fatalf("outcomes %v", f.oc.m)
	}
}
