package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// completeCounter is a Store that records the keys of every Complete call.
type completeCounter struct {
	idempotency.Store
	mu    sync.Mutex
	calls [][]string
}

// countingEngine is an engine on f's store, with f's hooks, whose Complete
// calls cc records.
func countingEngine(t *testing.T, f *fixture) (*idempotency.Engine, *completeCounter) {
	t.Helper()
	cc := &completeCounter{Store: f.store}
	eng, err := idempotency.New(cc, idempotency.Config{Hooks: consumer.Hooks{f.oc, f.calls}, StoreTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng, cc
}

func (s *completeCounter) Complete(ctx context.Context, cs []idempotency.Completion) ([]bool, error) {
	keys := make([]string, len(cs))
	for i, c := range cs {
		keys[i] = strings.TrimPrefix(c.Key, "orders:")
	}
	s.mu.Lock()
	s.calls = append(s.calls, keys)
	s.mu.Unlock()
	return s.Store.Complete(ctx, cs)
}

func (s *completeCounter) get() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// batchRecorder is a batch handler that records the keys of each call (as
// the claims in the messages' contexts name them) and fails the keys it is
// told to.
type batchRecorder struct {
	mu    sync.Mutex
	calls [][]string
	fail  map[string]error
	// during, if set, runs inside the first call.
	during func()
}

func (b *batchRecorder) handler(t *testing.T) consumer.BatchFunc {
	return func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
		keys := make([]string, len(msgs))
		for i, m := range msgs {
			ci, ok := dedupworker.ClaimOf(dedupworker.MessageContext(ctx, i))
			want := m.Header.Get("Idempotency-Key")
			if !ok || ci.Key != want {
				t.Errorf("message %d (%s): context claim %+v %v, want the claim of its own key", i, want, ci, ok)
			}
			keys[i] = want
			if err := b.fail[want]; err != nil {
				results[i].Err = err
				continue
			}
			results[i].Value = []byte("done-" + want)
		}
		b.mu.Lock()
		b.calls = append(b.calls, keys)
		first := len(b.calls) == 1
		b.mu.Unlock()
		if first && b.during != nil {
			b.during()
		}
	}
}

func TestProcessBatchCutsAtInFlightAndSettlesEachMessage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	eng, cc := countingEngine(t, f)
	ctx := context.Background()

	deliveries := map[string]*consumertest.Delivery{}
	order := []string{"k1", "dup", "k3", "busy", "k5", "flaky", "poison"}
	ds := make([]consumer.Delivery, len(order))
	for i, k := range order {
		d := consumertest.NewDelivery(consumertest.NewMessage(k, "payload-"+k), 1)
		d.Message().Origin.Offset = int64(i)
		deliveries[k] = d
		ds[i] = d
	}
	// "dup" was completed before; "busy" is held by another worker.
	claim := func(key string, lease time.Duration) idempotency.ClaimResult {
		t.Helper()
		res, err := f.store.Claim(ctx, []idempotency.ClaimRequest{{
			Key: idempotency.EffectiveKey("orders", key), Fingerprint: idempotency.Fingerprint(deliveries[key].Message(), nil),
			FingerprintVersion: idempotency.FingerprintVersion, Lease: lease, Retention: time.Hour,
		}})
		if err != nil || res[0].Outcome != idempotency.ClaimNew {
			t.Fatalf("claim %s: %+v %v", key, res, err)
		}
		return res[0]
	}
	dup := claim("dup", time.Minute)
	if ok, err := f.store.Complete(ctx, []idempotency.Completion{{Key: dup.Claim.Key, Token: dup.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Retention: time.Hour}}); err != nil || !ok[0] {
		t.Fatalf("complete dup: %v %v", ok, err)
	}
	busy := claim("busy", time.Minute)

	rec := &batchRecorder{
		fail: map[string]error{"flaky": errors.New("downstream hiccup"), "poison": dispatch.Permanent(errors.New("bad payload"))},
		// While the first run is in the handler, the other worker lets
		// "busy" go: the cut delivery, waiting for it, then claims it.
		during: func() {
			if _, err := f.store.Release(ctx, busy.Claim.Key, busy.Claim.Token, time.Minute); err != nil {
				t.Errorf("release busy: %v", err)
			}
		},
	}
	dedup, err := eng.Processor(idempotency.WithInFlightWait(time.Minute), idempotency.WithMaxAttempts(3))
	if err != nil {
		t.Fatal(err)
	}
	p := dedup("orders", rec.handler(t))
	if !p.Batching() {
		t.Fatalf("the engine's processor of a batch handler must batch (%T)", p)
	}
	p.Prepare(ctx, ds)
	p.ProcessBatch(ctx, ds)

	want := [][]string{{"k1", "k3"}, {"busy"}, {"k5", "flaky", "poison"}}
	if got := rec.calls; !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Fatalf("handler calls %v, want %v: duplicates never run, an in-flight key cuts the run, order kept", got, want)
	}
	// One Complete call per handler call: "flaky" failed and stores
	// nothing; "poison" is stored as dead-lettered with k5.
	wantCompletes := [][]string{{"k1", "k3"}, {"busy"}, {"k5", "poison"}}
	if got := cc.get(); !slices.EqualFunc(got, wantCompletes, slices.Equal[[]string]) {
		t.Fatalf("Complete calls %v, want %v", got, wantCompletes)
	}
	// ExpectAcked also holds that none of them was dead-lettered: only the
	// failing message may be.
	for _, k := range []string{"k1", "dup", "k3", "busy", "k5"} {
		deliveries[k].ExpectAcked(t)
	}
	if delay := deliveries["flaky"].ExpectNakked(t); delay <= 0 {
		t.Fatalf("flaky nakked with delay %s, want the backoff", delay)
	}
	if dl := deliveries["poison"].ExpectDeadLettered(t); dl.Reason != "permanent_error" {
		t.Fatalf("poison dead letter %+v, want permanent_error", dl)
	}
	if r, err := f.store.Get(ctx, idempotency.EffectiveKey("orders", "k3")); err != nil || r == nil || string(r.Result) != "done-k3" {
		t.Fatalf("k3 record %+v %v: want its own result stored", r, err)
	}

	// The failed message alone runs again, and completes.
	delete(rec.fail, "flaky")
	retry := consumertest.NewDelivery(consumertest.NewMessage("flaky", "payload-flaky"), 2)
	p.ProcessBatch(ctx, []consumer.Delivery{retry})
	retry.ExpectAcked(t)
	if got := rec.calls[len(rec.calls)-1]; !slices.Equal(got, []string{"flaky"}) || len(rec.calls) != 4 {
		t.Fatalf("handler calls %v: the retry must run flaky alone", rec.calls)
	}
	if got := f.oc.get(consumer.OutcomeDuplicate); got != 1 {
		t.Fatalf("%d duplicates, want 1", got)
	}
}

func TestProcessBatchPanicFailsEveryMessageOfTheCall(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h := consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
		results[0].Value = []byte("half done")
		panic("boom")
	})
	p := f.processor(t, h)
	ds := []consumer.Delivery{consumertest.NewDelivery(consumertest.NewMessage("a", "1"), 1), consumertest.NewDelivery(consumertest.NewMessage("b", "2"), 1)}
	p.Prepare(context.Background(), ds)
	p.ProcessBatch(context.Background(), ds)
	for _, d := range ds {
		d.(*consumertest.Delivery).ExpectNakked(t)
	}
	for _, k := range []string{"a", "b"} {
		r, err := f.store.Get(context.Background(), idempotency.EffectiveKey("orders", k))
		if err != nil || r != nil && r.State == idempotency.StateCompleted {
			t.Fatalf("%s record %+v %v: a panicking call completes nothing", k, r, err)
		}
	}
}

func TestProcessBatchLeaseRenewedForEveryClaim(t *testing.T) {
	t.Parallel()
	f := setup(t)
	lease := 600 * time.Millisecond
	keys := []string{"r1", "r2", "r3"}
	// The call outlasts three leases: each claim must be renewed while it
	// runs, or another worker could take its key.
	h := consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
		deadline := time.Now().Add(3 * lease)
		for time.Now().Before(deadline) {
			for i := range msgs {
				if err := dedupworker.MessageContext(ctx, i).Err(); err != nil {
					results[i].Err = err
				}
			}
			reqs := make([]idempotency.ClaimRequest, len(msgs))
			for i, m := range msgs {
				reqs[i] = idempotency.ClaimRequest{
					Key: idempotency.EffectiveKey("orders", keys[i]), Fingerprint: idempotency.Fingerprint(m, nil),
					FingerprintVersion: idempotency.FingerprintVersion, Lease: lease,
				}
			}
			res, err := f.store.Claim(context.Background(), reqs)
			if err != nil {
				t.Errorf("foreign claim: %v", err)
				return
			}
			for i, r := range res {
				if r.Outcome != idempotency.ClaimInFlight {
					t.Errorf("a foreign claim of running key %s: %s, want IN_FLIGHT", keys[i], r.Outcome)
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(lease / 4):
			}
		}
	})
	p := f.processor(t, h, idempotency.WithLease(lease))
	ds := make([]consumer.Delivery, len(keys))
	for i, k := range keys {
		ds[i] = consumertest.NewDelivery(consumertest.NewMessage(k, k), 1)
	}
	p.Prepare(context.Background(), ds)
	p.ProcessBatch(context.Background(), ds)
	for _, d := range ds {
		d.(*consumertest.Delivery).ExpectAcked(t)
	}
}

// batchDeliveries returns a delivery per key, in order, at offsets 0, 1, ...
// (a key given twice is the same message twice: a producer retry).
func batchDeliveries(keys ...string) []*consumertest.Delivery {
	ds := make([]*consumertest.Delivery, len(keys))
	for i, k := range keys {
		ds[i] = consumertest.NewDelivery(consumertest.NewMessage(k, "payload-"+k), 1)
		ds[i].Message().Origin.Offset = int64(i)
	}
	return ds
}

func asDeliveries(ds []*consumertest.Delivery) []consumer.Delivery {
	out := make([]consumer.Delivery, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out
}

func TestProcessBatchRepeatedKeyWaitsForItsOwnerWithoutCutting(t *testing.T) {
	t.Parallel()
	f := setup(t)
	eng, cc := countingEngine(t, f)
	dedup, err := eng.Processor()
	if err != nil {
		t.Fatal(err)
	}
	rec := &batchRecorder{}
	p := dedup("orders", rec.handler(t))
	ctx := context.Background()

	// "a" twice in one fetch: Prepare claims it for its first delivery
	// only, and the second is a duplicate once the first completed.
	ds := batchDeliveries("a", "b", "a", "c", "d")
	p.Prepare(ctx, asDeliveries(ds))
	p.ProcessBatch(ctx, asDeliveries(ds))

	want := [][]string{{"a", "b", "c", "d"}}
	if got := rec.calls; !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Fatalf("handler calls %v, want %v: the repeated key waits for the batch that owns it, and the batch is not cut", got, want)
	}
	if got := cc.get(); !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Fatalf("Complete calls %v, want %v", got, want)
	}
	for _, d := range ds {
		d.ExpectAcked(t)
	}
	if got := f.oc.get(consumer.OutcomeDuplicate); got != 1 {
		t.Fatalf("%d duplicates, want 1 (the second a)", got)
	}
	if got := f.oc.get(consumer.OutcomeProcessed); got != 4 {
		t.Fatalf("%d processed, want 4", got)
	}
}

func TestProcessBatchKeyInFlightAtPrepareAndDoneBeforeItsRunDoesNotCut(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rec := &batchRecorder{}
	p := f.processor(t, rec.handler(t))
	ctx := context.Background()

	// The dispatcher prepares the next fetch while the lane runs the
	// previous one: "a" of the second fetch is claimed while the first
	// fetch's "a" still holds it, and that one has completed by the time
	// the second fetch runs.
	first := batchDeliveries("a", "b")
	second := batchDeliveries("c", "a", "d")
	p.Prepare(ctx, asDeliveries(first))
	p.Prepare(ctx, asDeliveries(second))
	p.ProcessBatch(ctx, asDeliveries(first))
	p.ProcessBatch(ctx, asDeliveries(second))

	want := [][]string{{"a", "b"}, {"c", "d"}}
	if got := rec.calls; !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Fatalf("handler calls %v, want %v: a key found in flight by the batch claim and done by its run is a duplicate, not a cut", got, want)
	}
	for _, d := range append(first, second...) {
		d.ExpectAcked(t)
	}
	if got := f.oc.get(consumer.OutcomeDuplicate); got != 1 {
		t.Fatalf("%d duplicates, want 1 (the second fetch's a)", got)
	}
}

func TestProcessBatchRepeatedKeyRunsAfterTheBatchWhenItsOwnerFailed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	fail := errors.New("downstream hiccup")
	rec := &batchRecorder{fail: map[string]error{"a": fail}}
	p := f.processor(t, rec.handler(t))
	ctx := context.Background()

	ds := batchDeliveries("a", "b", "a", "c")
	p.Prepare(ctx, asDeliveries(ds))
	p.ProcessBatch(ctx, asDeliveries(ds))

	// The first "a" failed and released its claim; the second then claims
	// the key and runs on its own after the batch, never before a message
	// ahead of it. "c" went with the batch, as it does when the batch's "a"
	// fails and no second "a" follows.
	want := [][]string{{"a", "b", "c"}, {"a"}}
	if got := rec.calls; !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Fatalf("handler calls %v, want %v", got, want)
	}
	ds[0].ExpectNakked(t)
	ds[2].ExpectNakked(t)
	ds[1].ExpectAcked(t)
	ds[3].ExpectAcked(t)
}

// claimGate is a Store that records the keys of every Claim call and holds
// the first call until release is closed.
type claimGate struct {
	idempotency.Store
	release chan struct{}
	mu      sync.Mutex
	calls   [][]string
}

func (g *claimGate) Claim(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, error) {
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = strings.TrimPrefix(r.Key, "orders:")
	}
	g.mu.Lock()
	g.calls = append(g.calls, keys)
	first := len(g.calls) == 1
	g.mu.Unlock()
	if first {
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Store.Claim(ctx, reqs)
}

func (g *claimGate) get() [][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.calls)
}

// The batch claims of fetches made while one is in flight (other
// partitions') go to the store together in the next call, not one call
// each.
func TestPrepareClaimsOfConcurrentFetchesShareACall(t *testing.T) {
	t.Parallel()
	f := setup(t)
	g := &claimGate{Store: f.store, release: make(chan struct{})}
	eng, err := idempotency.New(g, idempotency.Config{StoreTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	dedup, err := eng.Processor()
	if err != nil {
		t.Fatal(err)
	}
	p := dedup("orders", consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil }))
	fetch := func(keys ...string) []consumer.Delivery {
		ds := make([]consumer.Delivery, len(keys))
		for i, k := range keys {
			ds[i] = consumertest.NewDelivery(consumertest.NewMessage(k, "payload-"+k), 1)
		}
		return ds
	}
	ctx := context.Background()
	fetches := [][]consumer.Delivery{fetch("a1", "a2"), fetch("b1"), fetch("c1", "c2")}
	// After each fetch: the first one's call is in flight, held by the
	// gate, and the later fetches' keys queue behind it.
	queued := []int{0, 1, 3}
	var wg sync.WaitGroup
	for i, ds := range fetches {
		wg.Go(func() { p.Prepare(ctx, ds) })
		testenv.EventuallyNil(t, 10*time.Second, fmt.Sprintf("after fetch %d, 1 call and %d claims queued", i, queued[i]), func() error {
			if calls, n := g.get(), eng.PrepareQueued(); len(calls) != 1 || n != queued[i] {
				return fmt.Errorf("calls %v, %d queued", calls, n)
			}
			return nil
		})
	}
	close(g.release)
	wg.Wait()
	want := [][]string{{"a1", "a2"}, {"b1", "c1", "c2"}}
	if got := g.get(); !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Fatalf("Claim calls %v, want %v", got, want)
	}
	// Each delivery runs under the claim its fetch's call made.
	for _, ds := range fetches {
		for _, d := range ds {
			p.Process(ctx, d)
			d.(*consumertest.Delivery).ExpectAcked(t)
		}
	}
	if got := g.get(); len(got) != 2 {
		t.Fatalf("Claim calls %v: a delivery claimed again when it ran, want it to run under its fetch's claim", got)
	}
	for _, k := range []string{"a1", "a2", "b1", "c1", "c2"} {
		if r, err := f.store.Get(ctx, idempotency.EffectiveKey("orders", k)); err != nil || r == nil || r.State != idempotency.StateCompleted {
			t.Fatalf("%s record %+v %v: want it completed", k, r, err)
		}
	}
}

// A run's completions linger for company while another handler runs; a
// single delivery's completion, which its lane waits for, never lingers
// and takes the lingering ones along; and once no handler runs, nothing
// lingers.
func TestCompletionLingersWhileAnotherHandlerRuns(t *testing.T) {
	t.Parallel()
	f := setup(t)
	eng, err := idempotency.New(f.store, idempotency.Config{CompletionLinger: time.Hour, StoreTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	ctx := context.Background()
	dedup, err := eng.Processor()
	if err != nil {
		t.Fatal(err)
	}
	gate, entered := make(chan struct{}), make(chan struct{})
	batch := dedup("orders", consumer.BatchFunc(func(_ context.Context, msgs []*consumer.Message, results []consumer.Result) {
		if msgs[0].Header.Get("Idempotency-Key") == "slow" {
			close(entered)
			<-gate
		}
		for i := range msgs {
			results[i].Value = []byte("ok")
		}
	}))
	deliveries := func(keys ...string) []consumer.Delivery {
		ds := make([]consumer.Delivery, len(keys))
		for i, k := range keys {
			ds[i] = consumertest.NewDelivery(consumertest.NewMessage(k, "payload-"+k), 1)
		}
		return ds
	}
	start := func(ds []consumer.Delivery) chan struct{} {
		batch.Prepare(ctx, ds)
		done := make(chan struct{})
		go func() {
			defer close(done)
			batch.ProcessBatch(ctx, ds)
		}()
		return done
	}
	within := func(c chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatal(what)
		}
	}

	slow := deliveries("slow")
	slowDone := start(slow)
	<-entered
	run := deliveries("r1", "r2")
	runDone := start(run)
	testenv.Eventually(t, 10*time.Second, "the run's 2 completions lingering while the slow handler runs", func() bool {
		return eng.CompletionsQueued() == 2
	})
	select {
	case <-runDone:
		t.Fatal("the run was settled while its completions lingered")
	default:
	}

	single := dedup("orders", consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return []byte("ok"), nil }))
	d := consumertest.NewDelivery(consumertest.NewMessage("s1", "3"), 1)
	processed := make(chan struct{})
	go func() {
		defer close(processed)
		single.Prepare(ctx, []consumer.Delivery{d})
		single.Process(ctx, d)
	}()
	within(processed, "a single delivery's completion lingered")
	within(runDone, "the lingering completions were not sent with the single delivery's")

	// The last handler returns: its run's completion has nothing to wait for.
	close(gate)
	within(slowDone, "a completion lingered while no handler ran")

	for _, d := range append(append(slow, run...), d) {
		d.(*consumertest.Delivery).ExpectAcked(t)
	}
	for _, k := range []string{"slow", "r1", "r2", "s1"} {
		if r, err := f.store.Get(ctx, idempotency.EffectiveKey("orders", k)); err != nil || r == nil || r.State != idempotency.StateCompleted {
			t.Fatalf("%s record %+v %v: want it completed", k, r, err)
		}
	}
}
