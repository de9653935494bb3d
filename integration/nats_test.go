package integration_test

// Integration tests of processing, failures and running over NATS JetStream: the
// deduplication engine on real Redis behind the JetStream Source, on the
// system nats-server and an embedded current one.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// TestNATSDuplicates: 10,000 messages, 3 in 10 of them repeating an earlier
// key as separate messages: the handler runs once per unique key, every
// message is acked, the consumer has nothing pending.
func TestNATSDuplicates(t *testing.T) {
	natsEachServer(t, func(t *testing.T, h *natsHarness) {
		plan := natsPlanWithDuplicates(7000, 3000)
		h.publish(t, plan)
		l := newNATSLedger()
		outs := &outcomeCounts{}
		h.start(t, natsWorkerSpec{handler: l.handler(), concurrency: 16, hooks: consumer.Hooks{outs}})
		h.drained(t, "c", uint64(len(plan)), 120*time.Second)
		checkDeduplicated(t, &l.runCounts, plan.unique(), outs, 7000, 3000)
	})
}

// TestNATSDuplicateRequestGetsStoredReply: a repeated request is answered
// with the stored result through OnDuplicate and Reply, without a new run.
func TestNATSDuplicateRequestGetsStoredReply(t *testing.T) {
	natsEachServer(t, func(t *testing.T, h *natsHarness) {
		var runs atomic.Int32
		var src atomic.Pointer[natssource.Source]
		handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			n := runs.Add(1)
			res := fmt.Appendf(nil, "result of run %d", n)
			return res, src.Load().Reply(ctx, m, res)
		})
		onDup := idempotency.WithOnDuplicate(func(ctx context.Context, d consumer.Delivery, rec *idempotency.Record) error {
			return src.Load().Reply(ctx, d.Message(), rec.Result)
		})
		r := h.start(t, natsWorkerSpec{handler: handler, opts: []idempotency.Option{onDup}})
		src.Store(r.src)
		for i := range 3 {
			m := nats.NewMsg(h.subj + ".orders")
			m.Data = []byte("order r1")
			m.Header.Set("Idempotency-Key", "r1")
			reply, err := natssource.Request(natsCtx(t, 20*time.Second), h.js, m)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if string(reply.Data) != "result of run 1" {
				t.Errorf("request %d answered %q", i, reply.Data)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("handler ran %d times", n)
		}
	})
}

// TestNATSCrash: a worker dies (its NATS connection and its Redis are cut,
// nothing is acked or released) while handlers run; a second worker on the
// same durable consumer finishes. Every key completes exactly once; only
// keys whose handler had started and never completed run again, and that
// second run holds a reclaimed claim with a higher fence.
func TestNATSCrash(t *testing.T) {
	natsEachServer(t, func(t *testing.T, h *natsHarness) {
		const n, lease = 60, 2 * time.Second
		plan := natsPlanWithDuplicates(n, 0)
		h.publish(t, plan)
		l := newNATSLedger()
		var (
			startedA = make(chan string, n)
			mu       sync.Mutex
			crashed  bool
		)
		// Worker A: the first 8 handlers hang (the process is about to die).
		ncA, jsA := natsConnect(t, h.url)
		redisA, proxyA := h.proxiedRedis(t)
		handlerA := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			key := l.start(ctx)
			startedA <- key
			<-ctx.Done() // never completes
			mu.Lock()
			defer mu.Unlock()
			if !crashed {
				l.complete(key)
			}
			return nil, ctx.Err()
		})
		a := h.start(t, natsWorkerSpec{js: jsA, redis: redisA, handler: handlerA, concurrency: 8, ackWait: lease,
			shutdown: -1, opts: []idempotency.Option{idempotency.WithLease(lease)}})
		hung := map[string]bool{}
		for len(hung) < 8 {
			select {
			case k := <-startedA:
				hung[k] = true
			case <-time.After(20 * time.Second):
				t.Fatalf("only %d handlers started on worker A", len(hung))
			}
		}
		// The crash: no ack, no nak, no release gets out.
		mu.Lock()
		crashed = true
		mu.Unlock()
		proxyA.Block()
		ncA.Close()
		if err := a.Stop(t, 20*time.Second); err != nil {
			t.Logf("worker A: %v", err)
		}

		// Worker B finishes everything.
		h.start(t, natsWorkerSpec{handler: l.handler(), concurrency: 8, ackWait: lease,
			opts: []idempotency.Option{idempotency.WithLease(lease), idempotency.WithBackoff(100*time.Millisecond, time.Second)}})
		h.drained(t, "c", n, 60*time.Second)

		l.mu.Lock()
		defer l.mu.Unlock()
		for _, k := range plan {
			if l.completes[k] != 1 {
				t.Errorf("key %s completed %d times", k, l.completes[k])
			}
			switch {
			case hung[k]:
				if l.starts[k] != 2 || !l.reclaimed[k] || len(l.fences[k]) != 2 || l.fences[k][1] <= l.fences[k][0] {
					t.Errorf("hung key %s: %d starts, reclaimed %v, fences %v; want a second, reclaimed run with a higher fence", k, l.starts[k], l.reclaimed[k], l.fences[k])
				}
			case l.starts[k] != 1:
				t.Errorf("key %s never hung but started %d times", k, l.starts[k])
			}
		}
	})
}

// TestNATSLongHandler: a handler running 3× AckWait and 3× the lease is
// neither redelivered nor reclaimed: lease renewals heartbeat JetStream.
func TestNATSLongHandler(t *testing.T) {
	natsEachServer(t, func(t *testing.T, h *natsHarness) {
		const lease = 1500 * time.Millisecond
		h.publish(t, natsPlan{"long"})
		l := newNATSLedger()
		outs := &outcomeCounts{}
		handler := l.slowHandler(3*lease+200*time.Millisecond, func() {})
		h.start(t, natsWorkerSpec{handler: handler, ackWait: lease, hooks: consumer.Hooks{outs},
			opts: []idempotency.Option{idempotency.WithLease(lease)}})
		h.drained(t, "c", 1, 30*time.Second)
		starts, completes := l.totals()
		if starts != 1 || completes != 1 {
			t.Errorf("started %d, completed %d; want once", starts, completes)
		}
		info, err := h.consumerInfo(t, "c")
		if err != nil {
			t.Fatal(err)
		}
		if info.Delivered.Stream != 1 || info.Delivered.Consumer != 1 {
			t.Errorf("delivered %d times (consumer sequence), want 1: redelivered", info.Delivered.Consumer)
		}
		if outs.get(consumer.OutcomeProcessed) != 1 || outs.get(consumer.OutcomeInFlight)+outs.get(consumer.OutcomeDuplicate)+outs.get(consumer.OutcomeReclaimed) != 0 {
			t.Errorf("outcomes %s", outs)
		}
	})
}

// TestNATSTwoWorkers: two workers on one durable consumer, with duplicates:
// every key runs exactly once.
func TestNATSTwoWorkers(t *testing.T) {
	natsEachServer(t, func(t *testing.T, h *natsHarness) {
		plan := natsPlanWithDuplicates(1400, 600)
		l := newNATSLedger()
		_, js2 := natsConnect(t, h.url)
		h.start(t, natsWorkerSpec{handler: l.handler(), concurrency: 8})
		h.start(t, natsWorkerSpec{js: js2, redis: h.redis, handler: l.handler(), concurrency: 8})
		h.publish(t, plan)
		h.drained(t, "c", uint64(len(plan)), 120*time.Second)
		starts, _ := l.totals()
		if starts != plan.unique() {
			t.Errorf("handler ran %d times for %d unique keys", starts, plan.unique())
		}
		l.eachRanOnce(t)
	})
}

// TestNATSErrorsDeadLetter: a failing handler is retried with the backoff;
// after max attempts the message lands on the dead-letter subject with its
// headers, and a later message with the same key is acked without running.
func TestNATSErrorsDeadLetter(t *testing.T) {
	natsEachServer(t, func(t *testing.T, h *natsHarness) {
		const backoff = 300 * time.Millisecond
		dlq := "dlq." + h.subj
		h.createStream(t, h.stream+"_DLQ", dlq)
		var (
			mu    sync.Mutex
			runs  []time.Time
			fails = errors.New("downstream says no")
		)
		handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			runs = append(runs, time.Now())
			return nil, fails
		})
		outs := &outcomeCounts{}
		h.start(t, natsWorkerSpec{handler: handler, dlq: dlq, hooks: consumer.Hooks{outs},
			opts: []idempotency.Option{idempotency.WithMaxAttempts(3), idempotency.WithBackoff(backoff, 4*backoff)}})
		h.publish(t, natsPlan{"bad"})
		h.drained(t, "c", 1, 30*time.Second)

		mu.Lock()
		if len(runs) != 3 {
			t.Fatalf("handler ran %d times, want 3 (max attempts)", len(runs))
		}
		for i := 1; i < len(runs); i++ {
			// Backoff doubles, jittered by up to a fifth: attempt i waits ≥ 0.8·backoff·2^(i-1).
			minGap := time.Duration(float64(backoff) * 0.8 * float64(int(1)<<(i-1)))
			if gap := runs[i].Sub(runs[i-1]); gap < minGap {
				t.Errorf("retry %d after %s, want at least %s", i, gap, minGap)
			}
		}
		mu.Unlock()

		ctx := natsCtx(t, 5*time.Second)
		st, err := h.js.Stream(ctx, h.stream+"_DLQ")
		if err != nil {
			t.Fatal(err)
		}
		raw, err := st.GetMsg(ctx, 1)
		if err != nil {
			t.Fatalf("no dead letter: %v", err)
		}
		want := map[string]string{
			"Idempotency-Key":                  "bad",
			consumer.HeaderDeadLetterReason:    "max_attempts",
			consumer.HeaderDeadLetterKey:       "bad",
			consumer.HeaderDeadLetterAttempts:  "3",
			consumer.HeaderDeadLetterHandler:   "orders",
			consumer.HeaderDeadLetterTransport: "nats",
			consumer.HeaderDeadLetterTopic:     h.stream,
			consumer.HeaderDeadLetterSubject:   h.subj + ".orders",
			consumer.HeaderDeadLetterOffset:    "1",
			consumer.HeaderDeadLetterError:     "downstream says no",
		}
		for k, v := range want {
			if got := raw.Header.Get(k); got != v {
				t.Errorf("dead-letter header %s = %q, want %q", k, got, v)
			}
		}
		if string(raw.Data) != "order bad" {
			t.Errorf("dead-letter payload %q", raw.Data)
		}

		// The same key again: acked as a duplicate of the dead-lettered record.
		h.publish(t, natsPlan{"bad"})
		h.drained(t, "c", 2, 30*time.Second)
		mu.Lock()
		defer mu.Unlock()
		if len(runs) != 3 {
			t.Errorf("the redelivered key ran again: %d runs", len(runs))
		}
		if outs.get(consumer.OutcomeDeadLettered) != 1 || outs.get(consumer.OutcomeDuplicate) != 1 {
			t.Errorf("outcomes %s", outs)
		}
	})
}

// TestNATSRedisDown: with Redis unreachable no handler runs and nothing is
// acked; when it returns, the worker finishes everything, once per key.
func TestNATSRedisDown(t *testing.T) {
	natsEachServer(t, func(t *testing.T, h *natsHarness) {
		client, proxy := h.proxiedRedis(t)
		l := newNATSLedger()
		outs := &outcomeCounts{}
		h.start(t, natsWorkerSpec{redis: client, handler: l.handler(), hooks: consumer.Hooks{outs},
			opts: []idempotency.Option{idempotency.WithStoreRetry(50*time.Millisecond, 300*time.Millisecond)}})
		first := natsPlanWithDuplicates(20, 0)
		h.publish(t, first)
		h.drained(t, "c", 20, 30*time.Second)

		proxy.Block()
		second := make(natsPlan, 30)
		for i := range second {
			second[i] = "down" + strconv.Itoa(i)
		}
		h.publish(t, second)
		// While Redis is down: the messages are delivered and refused again
		// and again (store errors), never run, never acked.
		testenv.EventuallyNil(t, 20*time.Second, "the worker to see the store down", func() error {
			if outs.get(consumer.OutcomeStoreError) >= 60 {
				return nil
			}
			return fmt.Errorf("outcomes %s", outs)
		})
		if starts, _ := l.totals(); starts != 20 {
			t.Errorf("%d handler runs while Redis was down", starts-20)
		}
		info, err := h.consumerInfo(t, "c")
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream != 20 {
			t.Errorf("ack floor moved to %d while Redis was down", info.AckFloor.Stream)
		}

		proxy.Unblock()
		h.drained(t, "c", 50, 60*time.Second)
		starts, completes := l.totals()
		if starts != 50 || completes != 50 {
			t.Errorf("after Redis returned: %d runs, %d completions, want 50", starts, completes)
		}
		l.eachRanOnce(t)
	})
}

// TestNATSShutdownInFlight: on shutdown, handlers past the drain timeout are
// cancelled, their claims released (not left to expire) and their messages
// handed back; Run returns nil; a new worker finishes all, each key once to
// completion.
func TestNATSShutdownInFlight(t *testing.T) {
	natsEachServer(t, func(t *testing.T, h *natsHarness) {
		const n = 12
		plan := natsPlanWithDuplicates(n, 0)
		h.publish(t, plan)
		l := newNATSLedger()
		started := make(chan string, n)
		blocking := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			key := l.start(ctx)
			started <- key
			<-ctx.Done()
			return nil, context.Cause(ctx)
		})
		lease := time.Minute // far longer than the test: only a release frees the keys
		a := h.start(t, natsWorkerSpec{handler: blocking, concurrency: 4, shutdown: 300 * time.Millisecond,
			opts: []idempotency.Option{idempotency.WithLease(lease)}})
		inflight := map[string]bool{}
		for len(inflight) < 4 {
			select {
			case k := <-started:
				inflight[k] = true
			case <-time.After(20 * time.Second):
				t.Fatal("handlers did not start")
			}
		}
		if err := a.Stop(t, 20*time.Second); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		store := natsStore(t, h)
		for k := range inflight {
			rec, err := store.Get(natsCtx(t, 5*time.Second), idempotency.EffectiveKey("orders", k))
			if err != nil {
				t.Fatal(err)
			}
			if rec == nil || rec.State != idempotency.StateClaimed || !rec.Released {
				t.Errorf("key %s after shutdown: %+v, want a released claim", k, rec)
			}
		}
		start := time.Now()
		h.start(t, natsWorkerSpec{handler: l.handler(), concurrency: 4, opts: []idempotency.Option{idempotency.WithLease(lease)}})
		h.drained(t, "c", n, 30*time.Second)
		if took := time.Since(start); took > lease/2 {
			t.Errorf("took %s: the claims were not released", took)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, k := range plan {
			if l.completes[k] != 1 {
				t.Errorf("key %s completed %d times", k, l.completes[k])
			}
			if want := map[bool]int{true: 2, false: 1}[inflight[k]]; l.starts[k] != want {
				t.Errorf("key %s started %d times, want %d", k, l.starts[k], want)
			}
		}
	})
}

// TestNATSWaitingDuplicateHeartbeats: a duplicate that waits for the owner
// of its key for 3× AckWait is heartbeated like the running
// handler, so it is not redelivered, and it is acked as a duplicate once the
// owner completes.
func TestNATSWaitingDuplicateHeartbeats(t *testing.T) {
	natsEachServer(t, func(t *testing.T, h *natsHarness) {
		const lease = 1500 * time.Millisecond
		started := make(chan struct{})
		var once sync.Once
		l := newNATSLedger()
		outs := &outcomeCounts{}
		handler := l.slowHandler(3*lease+200*time.Millisecond, func() { once.Do(func() { close(started) }) })
		h.start(t, natsWorkerSpec{handler: handler, ackWait: lease, hooks: consumer.Hooks{outs},
			opts: []idempotency.Option{idempotency.WithLease(lease), idempotency.WithInFlightWait(10 * lease)}})
		h.publish(t, natsPlan{"slow"})
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the handler did not start")
		}
		h.publish(t, natsPlan{"slow"}) // waits for the running claim
		h.drained(t, "c", 2, 30*time.Second)
		starts, completes := l.totals()
		if starts != 1 || completes != 1 {
			t.Errorf("started %d, completed %d; want once", starts, completes)
		}
		info, err := h.consumerInfo(t, "c")
		if err != nil {
			t.Fatal(err)
		}
		if info.Delivered.Consumer != 2 || info.NumRedelivered != 0 {
			t.Errorf("consumer sequence %d for 2 messages, %d redelivered: the waiting duplicate was redelivered", info.Delivered.Consumer, info.NumRedelivered)
		}
		if outs.get(consumer.OutcomeProcessed) != 1 || outs.get(consumer.OutcomeDuplicate) != 1 {
			t.Errorf("outcomes %s, want processed 1, duplicate 1", outs)
		}
	})
}
