package integration_test

// Integration tests of processing, failures and running over Kafka: the deduplication engine on
// real Redis behind the Kafka consumer-group Source, on real Apache Kafka
// (the local KRaft node of .ci/kafka.sh, or $KAFKA_BROKERS).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestKafkaDuplicates: 10,000 messages over 8 partitions, 3 in 10 of them
// repeating an earlier Idempotency-Key as separate messages, often on
// another partition: the handler runs once per unique key, and the group's
// committed offsets reach the end of every partition.
func TestKafkaDuplicates(t *testing.T) {
	kafkaEachBroker(t, func(t *testing.T, h *kafkaHarness) {
		h.createTopic(t, h.topic, 8)
		plan := kafkaPlanWithDuplicates(7000, 3000, 8)
		h.produce(t, h.topic, plan)
		l := newKafkaLedger()
		outs := &outcomeCounts{}
		r := h.start(t, kafkaWorkerSpec{handler: l.handler(), concurrency: 16, hooks: consumer.Hooks{outs}})
		h.atEnds(t, 120*time.Second)
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Fatalf("Run returned %v, want nil", err)
		}
		checkDeduplicated(t, &l.runCounts, plan.unique(), outs, 7000, 3000)
	})
}

// The crash helper is this test binary re-run as a separate process, so the
// "crash" is a real SIGKILL: no commit, no LeaveGroup, nothing flushed.
const kafkaCrashEnv = "DEDUP_KAFKA_CRASH_HELPER"

// kafkaCrashMember is the member that gets killed in
// TestKafkaCrashBeforeCommit: that test re-runs itself in a child process
// with kafkaCrashEnv set, and the child runs this until it is killed.
func kafkaCrashMember(t *testing.T) {
	h := &kafkaHarness{
		brokers: strings.Split(os.Getenv("DEDUP_KAFKA_BROKERS"), ","),
		topic:   os.Getenv("DEDUP_KAFKA_TOPIC"),
		group:   os.Getenv("DEDUP_KAFKA_GROUP"),
		ns:      os.Getenv("DEDUP_KAFKA_NS"),
	}
	store := newKafkaStore(t, h.ns)
	h.redis = store
	spy := &kafkaAckSpy{acked: map[int]map[int64]bool{}, onAck: func(o consumer.Origin) {
		fmt.Printf("acked %d %d\n", o.Partition, o.Offset)
	}}
	r := h.start(t, kafkaWorkerSpec{
		handler: newKafkaLedger().handler(),
		spy:     spy,
		// Never commit on the interval: the kill comes first.
		source: func(c *kafkasource.Config) { c.CommitInterval = time.Hour },
	})
	<-r.Done() // until killed
}

// TestKafkaCrashBeforeCommit: a member runs the handlers of every message,
// stores their results, acks them, and is killed before it commits; a new
// member of the group is redelivered those offsets and acks every one as a
// duplicate without running the handler.
func TestKafkaCrashBeforeCommit(t *testing.T) {
	if os.Getenv(kafkaCrashEnv) == "1" {
		kafkaCrashMember(t) // the child process
		return
	}
	kafkaEachBroker(t, func(t *testing.T, h *kafkaHarness) {
		h.createTopic(t, h.topic, 4)
		plan := kafkaPlanWithDuplicates(200, 0, 4)
		h.produce(t, h.topic, plan)

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestKafkaCrashBeforeCommit$", "-test.count=1")
		cmd.Env = append(os.Environ(), kafkaCrashEnv+"=1",
			"DEDUP_KAFKA_BROKERS="+strings.Join(h.brokers, ","), "DEDUP_KAFKA_TOPIC="+h.topic,
			"DEDUP_KAFKA_GROUP="+h.group, "DEDUP_KAFKA_NS="+h.ns)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		acked := map[string]bool{}
		sc := bufio.NewScanner(out)
		for len(acked) < len(plan) && sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "acked ") {
				acked[line] = true
			}
		}
		if len(acked) < len(plan) {
			t.Fatalf("the first member acked %d of %d messages before its output ended", len(acked), len(plan))
		}
		// Crash: SIGKILL after every handler ran and was acked, before the
		// first commit (the interval is an hour).
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for p, c := range h.committed(t) {
			if c >= 0 {
				t.Fatalf("partition %d: committed %d before the crash; the test needs none", p, c)
			}
		}

		l := newKafkaLedger()
		outs := &outcomeCounts{}
		r := h.start(t, kafkaWorkerSpec{handler: l.handler(), hooks: consumer.Hooks{outs}})
		// The killed member holds its partitions until its session times out.
		h.atEnds(t, 90*time.Second)
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if starts, _ := l.totals(); starts != 0 {
			t.Errorf("the new member ran the handler %d times, want 0", starts)
		}
		if got := outs.get(consumer.OutcomeDuplicate); got != len(plan) {
			t.Errorf("duplicates acked %d, want every redelivered message, %d (%s)", got, len(plan), outs)
		}
	})
}

// TestKafkaRebalance: a second member joins while handlers run, then the
// first leaves: no key runs twice, no message is skipped, and the committed
// offsets never pass a message that was not acked.
func TestKafkaRebalance(t *testing.T) {
	kafkaEachBroker(t, func(t *testing.T, h *kafkaHarness) {
		h.createTopic(t, h.topic, 4)
		plan := kafkaPlanWithDuplicates(1500, 0, 4)
		h.produce(t, h.topic, plan)
		l := newKafkaLedger()
		l.work = 2 * time.Millisecond
		spy := newKafkaAckSpy()
		stopWatch := h.watchCommits(t, spy)
		defer stopWatch()

		var byB atomic.Int32
		base := l.handler()
		onB := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			byB.Add(1)
			return base.Handle(ctx, m)
		})
		a := h.start(t, kafkaWorkerSpec{handler: base, concurrency: 8, spy: spy})
		testenv.Eventually(t, 60*time.Second, "progress of member A", func() bool { _, c := l.totals(); return c >= 200 })
		b := h.start(t, kafkaWorkerSpec{handler: onB, concurrency: 8, spy: spy})
		testenv.Eventually(t, 60*time.Second, "member B running handlers", func() bool { return byB.Load() >= 100 })
		if err := a.Stop(t, 30*time.Second); err != nil {
			t.Fatalf("member A: Run returned %v, want nil", err)
		}
		h.atEnds(t, 120*time.Second)
		if err := b.Stop(t, 30*time.Second); err != nil {
			t.Fatalf("member B: Run returned %v, want nil", err)
		}
		stopWatch()
		starts, completes := l.totals()
		if completes != plan.unique() {
			t.Errorf("%d handler completions for %d keys", completes, plan.unique())
		}
		l.eachRanOnce(t)
		if len(l.starts) != plan.unique() {
			t.Errorf("%d keys ran, want %d: messages were skipped", len(l.starts), plan.unique())
		}
		t.Logf("%d runs, %d by member B", starts, byB.Load())
	})
}

// TestKafkaKeyOrdering: with ordering "key", messages of one entity run in
// order while entities run in parallel; the committed offset is a watermark
// that waits for a slow early message while later ones finish.
func TestKafkaKeyOrdering(t *testing.T) {
	kafkaEachBroker(t, func(t *testing.T, h *kafkaHarness) {
		const entities, per = 10, 40
		h.createTopic(t, h.topic, 2)
		plan := kafkaPlan{{partition: 0, key: "slow", idem: "slow", value: "slow"}}
		for s := range per {
			for e := range entities {
				id := fmt.Sprintf("e%d-%d", e, s)
				plan = append(plan, kafkaMsg{partition: e % 2, key: fmt.Sprintf("e%d", e), idem: id, value: strconv.Itoa(s)})
			}
		}
		h.produce(t, h.topic, plan)

		release := make(chan struct{})
		var inflight, maxInflight atomic.Int32
		l := newKafkaLedger()
		base := l.handler()
		handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			n := inflight.Add(1)
			defer inflight.Add(-1)
			for old := maxInflight.Load(); n > old && !maxInflight.CompareAndSwap(old, n); old = maxInflight.Load() {
			}
			if string(m.Payload) == "slow" {
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return base.Handle(ctx, m)
		})
		spy := newKafkaAckSpy()
		stopWatch := h.watchCommits(t, spy)
		defer stopWatch()
		r := h.start(t, kafkaWorkerSpec{handler: handler, concurrency: 8, spy: spy,
			// MaxUnfinished lets the other keys of partition 0 (200 messages) run past the slow one.
			source: func(c *kafkasource.Config) {
				c.Ordering = kafkasource.OrderingKey
				c.BatchSize = 25
				c.MaxUnfinished = 250
			}})

		testenv.Eventually(t, 60*time.Second, "the messages after the slow one finished", func() bool { _, c := l.totals(); return c == len(plan)-1 })
		// Several commit intervals pass: partition 0 must stay at offset 0.
		for range 10 {
			if c := h.committed(t)[0]; c > 0 {
				t.Fatalf("partition 0 committed %d past the unfinished offset 0", c)
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(release)
		h.atEnds(t, 60*time.Second)
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		stopWatch()
		for e := range entities {
			key := fmt.Sprintf("e%d", e)
			got := l.bySeq[key]
			if len(got) != per {
				t.Errorf("entity %s: %d messages, want %d", key, len(got), per)
			}
			for i, v := range got {
				if v != strconv.Itoa(i) {
					t.Fatalf("entity %s: message #%d is sequence %s: out of order %v", key, i, v, got)
				}
			}
		}
		if m := maxInflight.Load(); m < 2 {
			t.Errorf("at most %d handlers ran at once: keys did not run in parallel", m)
		}
	})
}

// TestKafkaFailingHandler: a handler that keeps failing is retried in place
// with backoff, then dead-lettered with headers naming the error, key,
// attempts, topic, partition and offset; its partition continues after it.
func TestKafkaFailingHandler(t *testing.T) {
	kafkaEachBroker(t, func(t *testing.T, h *kafkaHarness) {
		h.createTopic(t, h.topic, 1)
		dlq := h.topic + ".dlq"
		h.createTopic(t, dlq, 1)
		h.produce(t, h.topic, kafkaPlan{
			{key: "c1", idem: "ok-1", value: "ok-1"},
			{key: "c1", idem: "bad", value: "bad"},
			{key: "c1", idem: "ok-2", value: "ok-2"},
			{key: "c1", idem: "ok-3", value: "ok-3"},
		})
		var mu sync.Mutex
		var badAt []time.Time
		var order []string
		handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, string(m.Payload))
			if string(m.Payload) == "bad" {
				badAt = append(badAt, time.Now())
				return nil, errors.New("downstream says no")
			}
			return nil, nil
		})
		outs := &outcomeCounts{}
		r := h.start(t, kafkaWorkerSpec{handler: handler, hooks: consumer.Hooks{outs},
			opts:   []idempotency.Option{idempotency.WithMaxAttempts(3), idempotency.WithBackoff(50*time.Millisecond, time.Second)},
			source: func(c *kafkasource.Config) { c.DeadLetterTopic = dlq }})
		h.atEnds(t, 60*time.Second)
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(badAt) != 3 {
			t.Fatalf("the failing handler ran %d times, want 3 (max attempts)", len(badAt))
		}
		for i := 1; i < len(badAt); i++ {
			if gap := badAt[i].Sub(badAt[i-1]); gap < 35*time.Millisecond {
				t.Errorf("attempt %d came %v after the previous one: no backoff", i+1, gap)
			}
		}
		if got := strings.Join(order, ","); got != "ok-1,bad,bad,bad,ok-2,ok-3" {
			t.Errorf("handled %s: the partition must wait for the retries and continue after", got)
		}
		dead := h.readAll(t, dlq)
		if len(dead) != 1 {
			t.Fatalf("dead-letter topic holds %d messages, want 1", len(dead))
		}
		hd := map[string]string{}
		for _, x := range dead[0].Headers {
			hd[x.Key] = string(x.Value)
		}
		want := map[string]string{
			consumer.HeaderDeadLetterKey:       "bad",
			consumer.HeaderDeadLetterAttempts:  "3",
			consumer.HeaderDeadLetterTopic:     h.topic,
			consumer.HeaderDeadLetterPartition: "0",
			consumer.HeaderDeadLetterOffset:    "1",
			consumer.HeaderDeadLetterTransport: "kafka",
			consumer.HeaderDeadLetterHandler:   "orders",
			"Idempotency-Key":                  "bad",
		}
		for k, v := range want {
			if hd[k] != v {
				t.Errorf("dead letter header %s = %q, want %q", k, hd[k], v)
			}
		}
		if !strings.Contains(hd[consumer.HeaderDeadLetterError], "downstream says no") {
			t.Errorf("dead letter error header %q does not carry the handler's error", hd[consumer.HeaderDeadLetterError])
		}
		if string(dead[0].Key) != "c1" || string(dead[0].Value) != "bad" {
			t.Errorf("dead letter key/value %q/%q, want the original c1/bad", dead[0].Key, dead[0].Value)
		}
		if got := outs.get(consumer.OutcomeDeadLettered); got != 1 {
			t.Errorf("dead_lettered outcomes %d, want 1 (%s)", got, outs)
		}
	})
}

// heldCompletion is a Store whose Complete of the key named hold waits
// until release is closed (or 4 s, within the engine's 5 s store timeout), as a
// slow store would.
type heldCompletion struct {
	idempotency.Store
	hold    string        // the raw key, the effective key's suffix
	entered chan struct{} // closed when a Complete of hold starts waiting
	release chan struct{}

	once     sync.Once
	mu       sync.Mutex
	released bool // a Complete of hold was let go by release, not by the timeout
}

func (s *heldCompletion) Complete(ctx context.Context, cs []idempotency.Completion) ([]bool, error) {
	for _, c := range cs {
		if !strings.HasSuffix(c.Key, ":"+s.hold) {
			continue
		}
		s.once.Do(func() { close(s.entered) })
		select {
		case <-s.release:
			s.mu.Lock()
			s.released = true
			s.mu.Unlock()
		case <-time.After(4 * time.Second):
		}
	}
	return s.Store.Complete(ctx, cs)
}

// TestKafkaPlainHandlerOverlapsCompletion: a plain handler (not a batch
// handler, as the binary's http and exec actions) on a partition starts the
// next message while the last one's completion is still being stored, and
// never before the last one's handler returned; every record is then
// COMPLETED, and the committed offset reaches the end.
func TestKafkaPlainHandlerOverlapsCompletion(t *testing.T) {
	kafkaEachBroker(t, func(t *testing.T, h *kafkaHarness) {
		h.createTopic(t, h.topic, 1)
		h.produce(t, h.topic, kafkaPlan{
			{key: "c1", idem: "m-1", value: "m-1"},
			{key: "c1", idem: "m-2", value: "m-2"},
			{key: "c1", idem: "m-3", value: "m-3"},
		})
		held := &heldCompletion{hold: "m-1", entered: make(chan struct{}), release: make(chan struct{})}
		var mu sync.Mutex
		var order []string
		running := 0
		handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			mu.Lock()
			running++
			order = append(order, fmt.Sprintf("%s running=%d", m.Payload, running))
			mu.Unlock()
			if string(m.Payload) == "m-2" {
				// m-1's completion may linger a moment before its store
				// call: wait for the call, then let it go. A lane that
				// waited for that call starts m-2 only after it gave up.
				select {
				case <-held.entered:
				case <-time.After(10 * time.Second):
				}
				close(held.release)
			}
			mu.Lock()
			running--
			mu.Unlock()
			return []byte("done"), nil
		})
		r := h.start(t, kafkaWorkerSpec{handler: handler, concurrency: 4,
			store: func(s idempotency.Store) idempotency.Store { held.Store = s; return held }})
		h.atEnds(t, 60*time.Second)
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"m-1 running=1", "m-2 running=1", "m-3 running=1"}; !slices.Equal(order, want) {
			t.Errorf("handled %q, want %q: in offset order, one at a time", order, want)
		}
		held.mu.Lock()
		defer held.mu.Unlock()
		if !held.released {
			t.Error("m-2's handler did not start while m-1's completion was being stored: the lane waited for it")
		}
		for _, k := range []string{"m-1", "m-2", "m-3"} {
			rec, err := h.redis.Get(context.Background(), idempotency.EffectiveKey("orders", k))
			if err != nil || rec == nil || rec.State != idempotency.StateCompleted {
				t.Errorf("%s: record %+v, %v; want COMPLETED", k, rec, err)
			}
		}
	})
}

// TestKafkaKcat checks the whole path with an independent client: kcat
// (librdkafka) produces messages with headers, including a repeated
// Idempotency-Key; the worker forwards each unique one to an output topic;
// kcat reads the results back.
func TestKafkaKcat(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		testenv.Unavailable(t, "kcat", "kcat is not installed (apt-get install -y kcat)")
	}
	kafkaEachBroker(t, func(t *testing.T, h *kafkaHarness) {
		h.createTopic(t, h.topic, 2)
		out := h.topic + ".out"
		h.createTopic(t, out, 1)
		for _, in := range []struct{ key, value, idem string }{
			{"cust-1", "order A", "A"},
			{"cust-2", "order B", "B"},
			{"cust-1", "order A", "A"}, // a producer retry
			{"cust-3", "order C", "C"},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			cmd := exec.CommandContext(ctx, kcat, "-P", "-b", h.brokers[0], "-t", h.topic, "-K", ":",
				"-H", "Idempotency-Key="+in.idem, "-H", "Origin=kcat")
			cmd.Stdin = strings.NewReader(in.key + ":" + in.value + "\n")
			b, err := cmd.CombinedOutput()
			cancel()
			if err != nil {
				t.Fatalf("kcat produce: %v\n%s", err, b)
			}
		}
		fw := &kafka.Writer{Addr: kafka.TCP(h.brokers...), Topic: out, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
		defer fw.Close()
		forward := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			hs := []kafka.Header{{Key: "Idempotency-Key", Value: []byte(m.Header.Get("Idempotency-Key"))}, {Key: "Origin", Value: []byte(m.Header.Get("Origin"))}}
			return nil, fw.WriteMessages(ctx, kafka.Message{Key: m.Key, Value: m.Payload, Headers: hs})
		})
		r := h.start(t, kafkaWorkerSpec{handler: forward})
		h.atEnds(t, 60*time.Second)
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := exec.CommandContext(ctx, kcat, "-C", "-b", h.brokers[0], "-t", out, "-o", "beginning", "-e", "-q",
			"-f", "%k|%s|%h\n").Output()
		if err != nil {
			t.Fatalf("kcat consume: %v", err)
		}
		got := strings.Split(strings.TrimSpace(string(b)), "\n")
		slices.Sort(got)
		want := []string{
			"cust-1|order A|Idempotency-Key=A,Origin=kcat",
			"cust-2|order B|Idempotency-Key=B,Origin=kcat",
			"cust-3|order C|Idempotency-Key=C,Origin=kcat",
		}
		if !slices.Equal(got, want) {
			t.Fatalf("kcat read back\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}
