package kafkasource_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestPartitionOrder: partitions run in parallel, each in offset order;
// every message runs exactly once (one member, no rebalance); the committed
// offsets reach the end of every partition; Run returns nil.
func TestPartitionOrder(t *testing.T) {
	t.Parallel()
	const parts, per = 4, 150
	e := newEnv(t, parts)
	var msgs []msg
	for i := range per {
		for p := range parts {
			msgs = append(msgs, msg{partition: p, value: strconv.Itoa(i)})
		}
	}
	e.produce(e.topic, msgs)

	rec := newRecord()
	// The first two partitions to start wait until both are in the
	// handler: this only completes if partitions run in parallel.
	const concurrency = 2
	var arrived atomic.Int32
	allIn := make(chan struct{})
	var inflight, maxInflight atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			old := maxInflight.Load()
			if n <= old || maxInflight.CompareAndSwap(old, n) {
				break
			}
		}
		rec.start(m)
		if m.Origin.Offset != 0 {
			rec.finish(m)
			return nil, nil
		}
		if n := arrived.Add(1); n <= concurrency {
			if n == concurrency {
				close(allIn)
			}
			select {
			case <-allIn:
			case <-time.After(10 * time.Second):
				return nil, errors.New("partitions did not run in parallel")
			}
		}
		rec.finish(m)
		return nil, nil
	})
	w := worker(t, "order", e.source(nil), h, dispatch.WithConcurrency(concurrency))
	r := run(t, w)

	ends := e.ends(e.topic, parts)
	testenv.Eventually(t, 30*time.Second, "committed offsets at the partition ends", func() bool { return reachedEnds(e.committed(), ends) })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	if got := maxInflight.Load(); got > concurrency {
		t.Errorf("max deliveries in Process at once = %d, want ≤ concurrency %d", got, concurrency)
	}
	for p := range parts {
		seen := rec.seen[p]
		if len(seen) != per {
			t.Errorf("partition %d: handled %d messages, want %d", p, len(seen), per)
			continue
		}
		for i, o := range seen {
			if o != int64(i) {
				t.Fatalf("partition %d: message #%d had offset %d: out of order", p, i, o)
			}
		}
	}
}

// TestKeyOrdering: under key ordering distinct keys of one partition run in
// parallel while each key stays in order; the commit is a watermark: a
// later offset finishing first does not move it past an unfinished one.
func TestKeyOrdering(t *testing.T) {
	t.Parallel()
	const keys, per = 8, 40
	e := newEnv(t, 1)
	var msgs []msg
	// The first message (offset 0, key "slow") blocks until released.
	msgs = append(msgs, msg{key: "slow", value: "0"})
	for i := range per {
		for k := range keys {
			msgs = append(msgs, msg{key: fmt.Sprintf("k%d", k), value: strconv.Itoa(i)})
		}
	}
	e.produce(e.topic, msgs)
	total := int64(len(msgs))

	rec := newRecord()
	release := make(chan struct{})
	var slowIn atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		rec.start(m)
		if string(m.Key) == "slow" {
			slowIn.Store(true)
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		} else {
			// Some work, so keys overlap and finish out of order.
			time.Sleep(time.Duration(len(m.Payload)%3) * time.Millisecond)
		}
		rec.finish(m)
		return nil, nil
	})
	// MaxUnfinished lets the other keys run past the slow one to the end.
	src := e.source(func(c *kafkasource.Config) {
		c.Ordering = kafkasource.OrderingKey
		c.BatchSize = 50
		c.MaxUnfinished = 400
	})
	w := worker(t, "keys", src, h, dispatch.WithConcurrency(4))
	r := run(t, w)

	// Everything but the slow message finishes.
	testenv.Eventually(t, 30*time.Second, "all other messages handled", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.finished[0]) == int(total-1)
	})
	if !slowIn.Load() {
		t.Fatal("the slow message never started")
	}
	// Give the committer several intervals: it must still commit nothing
	// past offset 0, the unfinished one.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if c := e.committed()[0]; c > 0 {
			t.Fatalf("committed offset %d passes unfinished offset 0", c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(release)
	testenv.Eventually(t, 10*time.Second, "commit at the partition end", func() bool { return e.committed()[0] == total })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		seq := rec.byKey[key]
		if len(seq) != per {
			t.Errorf("key %s: %d messages, want %d", key, len(seq), per)
		}
		for i, n := range seq {
			if n != i {
				t.Fatalf("key %s: message #%d has sequence %d: out of order: %v", key, i, n, seq)
			}
		}
	}
	// Keys ran in parallel: handled offsets are not in offset order.
	seen := rec.seen[0]
	inOrder := true
	for i := 1; i < len(seen); i++ {
		inOrder = inOrder && seen[i] > seen[i-1]
	}
	if inOrder {
		t.Error("key ordering handled the partition strictly in offset order: keys did not run in parallel")
	}
}

// deadLetterAfter3 is a processor that naks twice with a short delay, then
// dead-letters with a key and acks: what the engine does after max attempts.
func deadLetterAfter3(bad string, calls *sync.Map) consumer.ProcessorFactory {
	return func(name string, next consumer.Handler) consumer.Processor {
		return consumer.ProcessorFunc(func(ctx context.Context, d consumer.Delivery) {
			m := d.Message()
			if ctx.Err() != nil {
				_ = d.Nak(ctx, 0)
				return
			}
			if string(m.Payload) != bad {
				if _, err := next.Handle(ctx, m); err != nil {
					_ = d.Nak(ctx, 0)
					return
				}
				_ = d.Ack(ctx)
				return
			}
			v, _ := calls.LoadOrStore(m.Origin.Offset, &callLog{})
			cl := v.(*callLog)
			cl.add(d.Attempt())
			if d.Attempt() < 3 {
				_ = d.Nak(ctx, 50*time.Millisecond)
				return
			}
			if err := d.DeadLetter(ctx, consumer.DeadLetter{Reason: "max_attempts", Err: "boom", Key: "idem-1", Handler: name, Attempts: d.Attempt()}); err != nil {
				_ = d.Nak(ctx, 50*time.Millisecond)
				return
			}
			_ = d.Ack(ctx)
		})
	}
}

type callLog struct {
	mu       sync.Mutex
	attempts []int
	at       []time.Time
}

func (c *callLog) add(a int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts = append(c.attempts, a)
	c.at = append(c.at, time.Now())
}

// TestRetryInPlaceThenDeadLetter: a nakked message is retried in place after
// the delay with Attempt()+1 while its partition waits, then dead-lettered
// with its key, payload, original headers and the dead-letter headers; the
// partition continues after it.
func TestRetryInPlaceThenDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	dlq := e.topic + ".dlq"
	testenv.CreateKafkaTopic(t, e.brokers, dlq, 1)
	e.produce(e.topic, []msg{
		{partition: 1, value: "ok-1"},
		{partition: 1, key: "entity-7", value: "bad", headers: hdrs("Trace", "a", "Trace", "b", "Idempotency-Key", "idem-1")},
		{partition: 1, value: "ok-2"},
		{partition: 1, value: "ok-3"},
	})
	rec := newRecord()
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		rec.start(m)
		rec.finish(m)
		return nil, nil
	})
	var calls sync.Map
	src := e.source(func(c *kafkasource.Config) { c.DeadLetterTopic = dlq })
	w := worker(t, "dl", src, h, dispatch.WithProcessor(deadLetterAfter3("bad", &calls)))
	r := run(t, w)
	testenv.Eventually(t, 30*time.Second, "commit at the end of partition 1", func() bool { return e.committed()[1] == 4 })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}

	v, ok := calls.Load(int64(1))
	if !ok {
		t.Fatal("the failing message was never processed")
	}
	cl := v.(*callLog)
	if fmt.Sprint(cl.attempts) != "[1 2 3]" {
		t.Fatalf("attempts = %v, want [1 2 3]", cl.attempts)
	}
	for i := 1; i < len(cl.at); i++ {
		if gap := cl.at[i].Sub(cl.at[i-1]); gap < 45*time.Millisecond {
			t.Errorf("retry %d came %v after the previous attempt, want ≥ the 50ms nak delay", i, gap)
		}
	}
	// The partition waited: the messages after it ran after its last attempt.
	if got := fmt.Sprint(rec.seen[1]); got != "[0 2 3]" {
		t.Errorf("partition 1 handled offsets %s, want [0 2 3]", got)
	}

	dead := e.readAll(dlq, 1)
	if len(dead) != 1 {
		t.Fatalf("dead-letter topic holds %d messages, want 1", len(dead))
	}
	d := dead[0]
	if string(d.Key) != "entity-7" || string(d.Value) != "bad" {
		t.Errorf("dead letter key/value = %q/%q, want entity-7/bad", d.Key, d.Value)
	}
	got := map[string][]string{}
	for _, h := range d.Headers {
		got[h.Key] = append(got[h.Key], string(h.Value))
	}
	want := map[string]string{
		consumer.HeaderDeadLetterReason:    "max_attempts",
		consumer.HeaderDeadLetterError:     "boom",
		consumer.HeaderDeadLetterKey:       "idem-1",
		consumer.HeaderDeadLetterHandler:   "dl",
		consumer.HeaderDeadLetterAttempts:  "3",
		consumer.HeaderDeadLetterTransport: "kafka",
		consumer.HeaderDeadLetterTopic:     e.topic,
		consumer.HeaderDeadLetterPartition: "1",
		consumer.HeaderDeadLetterOffset:    "1",
		"Idempotency-Key":                  "idem-1",
	}
	for k, v := range want {
		if len(got[k]) != 1 || got[k][0] != v {
			t.Errorf("dead letter header %s = %q, want [%q]", k, got[k], v)
		}
	}
	if strings.Join(got["Trace"], ",") != "a,b" {
		t.Errorf("repeated header Trace = %q, want [a b] in order", got["Trace"])
	}
}

// TestNoDeadLetterTopic: DeadLetter without a topic is ErrNoDeadLetter.
func TestNoDeadLetterTopic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(e.topic, []msg{{value: "x"}})
	got := make(chan error, 1)
	proc := func(name string, next consumer.Handler) consumer.Processor {
		return consumer.ProcessorFunc(func(ctx context.Context, d consumer.Delivery) {
			select {
			case got <- d.DeadLetter(ctx, consumer.DeadLetter{Reason: "x"}):
			default:
			}
			_ = d.Ack(ctx)
		})
	}
	w := worker(t, "nodl", e.source(nil), consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil }), dispatch.WithProcessor(proc))
	r := run(t, w)
	select {
	case err := <-got:
		if !errors.Is(err, consumer.ErrNoDeadLetter) {
			t.Errorf("DeadLetter = %v, want ErrNoDeadLetter", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}
