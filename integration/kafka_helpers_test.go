package integration_test

// Helpers of the Kafka integration tests. Every name starts with "kafka" so
// the tests of other transports in this package cannot collide with them.

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// kafkaEachBroker runs f against real Apache Kafka (testenv.Kafka: the
// local KRaft node or $KAFKA_BROKERS) as the subtest "kafka".
func kafkaEachBroker(t *testing.T, f func(t *testing.T, h *kafkaHarness)) {
	t.Helper()
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		f(t, newKafkaHarness(t, testenv.Kafka(t)))
	})
}

// kafkaHarness is one test's topic, group and Redis namespace.
type kafkaHarness struct {
	brokers []string
	topic   string
	group   string
	parts   int
	ns      string
	redis   *redisbackend.Store
}

func newKafkaHarness(t *testing.T, brokers []string) *kafkaHarness {
	t.Helper()
	name := strings.NewReplacer("/", "-", " ", "-", "_", "-").Replace(t.Name())
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	id := testenv.RandID()
	h := &kafkaHarness{brokers: brokers, topic: "it-" + name + "-" + id, ns: "it-kafka-" + id}
	h.group = h.topic + "-g"
	h.redis = newKafkaStore(t, h.ns)
	testenv.DropNamespace(t, h.ns)
	return h
}

// newKafkaStore returns a Redis store on the test Redis, closed at the end.
func newKafkaStore(t testing.TB, ns string) *redisbackend.Store {
	t.Helper()
	store, err := redisbackend.New(testenv.RedisClient(t), redisbackend.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return store
}

func (h *kafkaHarness) createTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	testenv.CreateKafkaTopic(t, h.brokers, topic, partitions)
	if topic == h.topic {
		h.parts = partitions
	}
}

// kafkaPlan is what a test produces: one message per entry.
type kafkaPlan []kafkaMsg

type kafkaMsg struct {
	partition int
	key       string // Kafka message key (an entity id)
	idem      string // Idempotency-Key header
	value     string
}

// kafkaPlanWithDuplicates returns unique messages plus dups separate
// messages repeating earlier idempotency keys (same payload), spread over
// partitions at random, so a duplicate often lands on another partition.
func kafkaPlanWithDuplicates(unique, dups, partitions int) kafkaPlan {
	rnd := mrand.New(mrand.NewPCG(1, 2))
	p := make(kafkaPlan, 0, unique+dups)
	for i := range unique {
		id := fmt.Sprintf("key-%05d", i)
		p = append(p, kafkaMsg{partition: rnd.IntN(partitions), idem: id, value: "payload of " + id})
	}
	for range dups {
		orig := p[rnd.IntN(unique)]
		orig.partition = rnd.IntN(partitions)
		p = append(p, orig)
	}
	rnd.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

func (p kafkaPlan) unique() int {
	seen := map[string]bool{}
	for _, m := range p {
		seen[m.idem] = true
	}
	return len(seen)
}

// produce writes p to topic, each message to its partition, and waits
// for the acks.
func (h *kafkaHarness) produce(t testing.TB, topic string, p kafkaPlan) {
	t.Helper()
	msgs := make([]kafka.Message, len(p))
	for i, m := range p {
		msgs[i] = kafka.Message{Partition: m.partition, Value: []byte(m.value)}
		if m.key != "" {
			msgs[i].Key = []byte(m.key)
		}
		if m.idem != "" {
			msgs[i].Headers = []kafka.Header{{Key: "Idempotency-Key", Value: []byte(m.idem)}}
		}
	}
	testenv.ProduceKafka(t, h.brokers, topic, msgs)
}

// committed returns the group's committed offsets (-1: none).
func (h *kafkaHarness) committed(t testing.TB) map[int]int64 {
	return testenv.KafkaCommitted(t, h.brokers, h.group, h.topic, h.parts)
}

func (h *kafkaHarness) ends(t testing.TB, topic string, partitions int) map[int]int64 {
	t.Helper()
	return testenv.KafkaEnds(t, h.brokers, topic, partitions)
}

// atEnds waits until the committed offsets reach the end of every partition.
func (h *kafkaHarness) atEnds(t *testing.T, timeout time.Duration) {
	t.Helper()
	ends := h.ends(t, h.topic, h.parts)
	testenv.EventuallyNil(t, timeout, fmt.Sprintf("commits at the ends %v", ends), func() error {
		last := h.committed(t)
		for p, e := range ends {
			if last[p] != e {
				return fmt.Errorf("committed %v", last)
			}
		}
		return nil
	})
}

// readAll reads every message of a single-partition topic.
func (h *kafkaHarness) readAll(t *testing.T, topic string) []kafka.Message {
	t.Helper()
	return testenv.ReadKafka(t, h.brokers, topic, 1)
}

// kafkaWorkerSpec configures a worker started by kafkaHarness.start.
type kafkaWorkerSpec struct {
	handler     consumer.Handler
	concurrency int
	hooks       consumer.Hooks
	opts        []idempotency.Option
	source      func(*kafkasource.Config)
	spy         *kafkaAckSpy
	// store, when set, wraps the harness's store for the engine.
	store func(idempotency.Store) idempotency.Store
}

func (h *kafkaHarness) sourceConfig(t testing.TB) kafkasource.Config {
	return kafkasource.Config{
		Brokers:           h.brokers,
		Topic:             h.topic,
		GroupID:           h.group,
		SessionTimeout:    6 * time.Second, // real Kafka's minimum by default
		HeartbeatInterval: 100 * time.Millisecond,
		RebalanceTimeout:  10 * time.Second,
		RevokeTimeout:     3 * time.Second,
		MaxWait:           100 * time.Millisecond,
		CommitInterval:    100 * time.Millisecond,
		Logger:            testenv.Logger(t),
	}
}

func (h *kafkaHarness) start(t *testing.T, spec kafkaWorkerSpec) *testenv.Running {
	t.Helper()
	cfg := h.sourceConfig(t)
	if spec.source != nil {
		spec.source(&cfg)
	}
	src, err := kafkasource.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var store idempotency.Store = h.redis
	if spec.store != nil {
		store = spec.store(store)
	}
	engine, err := idempotency.New(store, idempotency.Config{Logger: testenv.Logger(t), Hooks: spec.hooks})
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]idempotency.Option{
		idempotency.WithLease(10 * time.Second),
		idempotency.WithBackoff(20*time.Millisecond, 200*time.Millisecond),
	}, spec.opts...)
	dedup, err := engine.Processor(opts...)
	if err != nil {
		t.Fatal(err)
	}
	if spec.concurrency == 0 {
		spec.concurrency = 16
	}
	wcfg := dispatch.Config{Logger: testenv.Logger(t), Hooks: spec.hooks, ShutdownTimeout: 10 * time.Second}
	if spec.spy != nil {
		wcfg.Wrap = []consumer.ProcessorWrapper{spec.spy.wrap}
	}
	w := dispatch.NewWorker(wcfg)
	if err := w.Handle("orders", src, spec.handler, dispatch.WithConcurrency(spec.concurrency), dispatch.WithProcessor(dedup)); err != nil {
		t.Fatal(err)
	}
	return testenv.Go(t, w.Run)
}

// kafkaLedger counts handler runs per idempotency key.
type kafkaLedger struct {
	runCounts
	bySeq map[string][]string // Kafka key → payloads in handling order
	work  time.Duration
}

func newKafkaLedger() *kafkaLedger {
	return &kafkaLedger{runCounts: newRunCounts(), bySeq: map[string][]string{}}
}

func (l *kafkaLedger) handler() consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		c, _ := dedupworker.ClaimOf(ctx)
		l.mu.Lock()
		l.starts[c.Key]++
		if len(m.Key) > 0 {
			l.bySeq[string(m.Key)] = append(l.bySeq[string(m.Key)], string(m.Payload))
		}
		l.mu.Unlock()
		if l.work > 0 {
			select {
			case <-time.After(l.work):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		l.mu.Lock()
		l.completes[c.Key]++
		l.mu.Unlock()
		return []byte("done " + c.Key), nil
	})
}

// kafkaAckSpy records every acked (partition, offset) by wrapping the
// deliveries the engine's Processor sees — in Prepare, Process and
// ProcessBatch alike, so the engine's batch claims still match its
// deliveries.
type kafkaAckSpy struct {
	mu    sync.Mutex
	acked map[int]map[int64]bool
	onAck func(consumer.Origin) // optional
}

func newKafkaAckSpy() *kafkaAckSpy { return &kafkaAckSpy{acked: map[int]map[int64]bool{}} }

// wrap is a consumer.ProcessorWrapper.
func (s *kafkaAckSpy) wrap(_ string, inner consumer.Processor) consumer.Processor {
	return &kafkaSpyProc{spy: s, inner: inner, wrapped: map[consumer.Delivery]*kafkaSpyDelivery{}}
}

func (s *kafkaAckSpy) record(o consumer.Origin) {
	s.mu.Lock()
	if s.acked[o.Partition] == nil {
		s.acked[o.Partition] = map[int64]bool{}
	}
	s.acked[o.Partition][o.Offset] = true
	s.mu.Unlock()
	if s.onAck != nil {
		s.onAck(o)
	}
}

// unfinishedBelow returns an offset below committed[p] that was never acked.
func (s *kafkaAckSpy) unfinishedBelow(committed map[int]int64) (int, int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, c := range committed {
		for o := int64(0); o < c; o++ {
			if !s.acked[p][o] {
				return p, o, true
			}
		}
	}
	return 0, 0, false
}

type kafkaSpyProc struct {
	spy     *kafkaAckSpy
	inner   consumer.Processor
	mu      sync.Mutex
	wrapped map[consumer.Delivery]*kafkaSpyDelivery
}

func (p *kafkaSpyProc) Prepare(ctx context.Context, batch []consumer.Delivery) {
	ws := make([]consumer.Delivery, len(batch))
	p.mu.Lock()
	for i, d := range batch {
		w := &kafkaSpyDelivery{Delivery: d, spy: p.spy}
		p.wrapped[d] = w
		ws[i] = w
	}
	p.mu.Unlock()
	p.inner.Prepare(ctx, ws)
}

func (p *kafkaSpyProc) Process(ctx context.Context, d consumer.Delivery) {
	p.inner.Process(ctx, p.take(d))
}

func (p *kafkaSpyProc) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	ws := make([]consumer.Delivery, len(ds))
	for i, d := range ds {
		ws[i] = p.take(d)
	}
	p.inner.ProcessBatch(ctx, ws)
}

func (p *kafkaSpyProc) Batching() bool { return p.inner.Batching() }

// take returns the spying delivery Prepare made for d, or a new one.
func (p *kafkaSpyProc) take(d consumer.Delivery) consumer.Delivery {
	p.mu.Lock()
	w, ok := p.wrapped[d]
	delete(p.wrapped, d)
	p.mu.Unlock()
	if !ok {
		w = &kafkaSpyDelivery{Delivery: d, spy: p.spy}
	}
	return w
}

type kafkaSpyDelivery struct {
	consumer.Delivery
	spy *kafkaAckSpy
}

func (d *kafkaSpyDelivery) Ack(ctx context.Context) error {
	d.spy.record(d.Message().Origin)
	return d.Delivery.Ack(ctx)
}

// kafkaWatchCommits fails the test if the group's committed offset of a
// partition ever passes a message that was not acked.
func (h *kafkaHarness) watchCommits(t *testing.T, spy *kafkaAckSpy) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			c := h.committed(t)
			if p, o, bad := spy.unfinishedBelow(c); bad {
				t.Errorf("partition %d: committed offset %d passes unacked offset %d", p, c[p], o)
				return
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}
