package kafkasource_test

import (
	"context"
	"strconv"
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

var topicSeq atomic.Int64

// env is one test's broker, topic and group.
type env struct {
	t       *testing.T
	brokers []string
	topic   string
	group   string
	parts   int
}

func newEnv(t *testing.T, partitions int) *env {
	t.Helper()
	return envOn(t, testenv.Kafka(t), partitions)
}

// newRealEnv is newEnv on the real Kafka broker only (no kfake fallback).
func newRealEnv(t *testing.T, partitions int) *env {
	t.Helper()
	return envOn(t, testenv.RealKafka(t), partitions)
}

// envOn makes a topic of its own, and names a group, on brokers.
func envOn(t *testing.T, brokers []string, partitions int) *env {
	t.Helper()
	e := &env{
		t:       t,
		brokers: brokers,
		topic:   testenv.UniqueName(t, "t"),
		parts:   partitions,
	}
	e.group = e.topic + "-g"
	testenv.CreateKafkaTopic(t, brokers, e.topic, partitions)
	return e
}

// config returns a Source config tuned for fast tests.
func (e *env) config() kafkasource.Config {
	return kafkasource.Config{
		Brokers:           e.brokers,
		Topic:             e.topic,
		GroupID:           e.group,
		SessionTimeout:    3 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		RebalanceTimeout:  5 * time.Second,
		RevokeTimeout:     2 * time.Second,
		MaxWait:           100 * time.Millisecond,
		CommitInterval:    100 * time.Millisecond,
		Logger:            testenv.Logger(e.t),
	}
}

func (e *env) source(mod func(*kafkasource.Config)) *kafkasource.Source {
	e.t.Helper()
	cfg := e.config()
	if mod != nil {
		mod(&cfg)
	}
	s, err := kafkasource.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// msg is a message to produce to a given partition.
type msg struct {
	partition int
	key       string
	value     string
	headers   []kafka.Header
}

// produce writes msgs, each to its partition, and waits for the acks.
func (e *env) produce(topic string, msgs []msg) {
	e.t.Helper()
	out := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		out[i] = kafka.Message{Partition: m.partition, Value: []byte(m.value), Headers: m.headers}
		if m.key != "" {
			out[i].Key = []byte(m.key)
		}
	}
	testenv.ProduceKafka(e.t, e.brokers, topic, out)
}

// committed returns the group's committed offset per partition (-1: none).
func (e *env) committed() map[int]int64 {
	e.t.Helper()
	return testenv.KafkaCommitted(e.t, e.brokers, e.group, e.topic, e.parts)
}

// ends returns the log-end offset of every partition of topic.
func (e *env) ends(topic string, partitions int) map[int]int64 {
	e.t.Helper()
	return testenv.KafkaEnds(e.t, e.brokers, topic, partitions)
}

// readAll reads every message of topic's partitions from the start.
func (e *env) readAll(topic string, partitions int) []kafka.Message {
	e.t.Helper()
	return testenv.ReadKafka(e.t, e.brokers, topic, partitions)
}

// run runs w until the test stops it (Stop) or ends.
func run(t *testing.T, w *dispatch.Worker) *testenv.Running {
	t.Helper()
	return testenv.Go(t, w.Run)
}

func worker(t *testing.T, name string, src consumer.Source, h consumer.Handler, opts ...dispatch.HandleOption) *dispatch.Worker {
	t.Helper()
	w := dispatch.NewWorker(dispatch.Config{Logger: testenv.Logger(t), ShutdownTimeout: 10 * time.Second})
	if err := w.Handle(name, src, h, opts...); err != nil {
		t.Fatal(err)
	}
	return w
}

// ignore is a handler that does nothing.
var ignore = consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })

// produceOne writes one message with value to topic through transport
// (a listener's TLS and SASL), within 30s.
func produceOne(t *testing.T, brokers []string, topic string, transport *kafka.Transport, value string) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond, Transport: transport}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(value)}); err != nil {
		t.Fatalf("producing to %s on %v: %v", topic, brokers, err)
	}
}

// firstPayload runs a worker whose handler, called name, takes src's
// messages until it gets its first one, stops the worker and returns that
// message's payload. It fails the test, naming what, when nothing comes
// within 30s or Run does not return nil within 30s of the stop.
func firstPayload(t *testing.T, what, name string, src consumer.Source) string {
	t.Helper()
	got := make(chan string, 1)
	r := run(t, worker(t, name, src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		select {
		case got <- string(m.Payload):
		default:
		}
		return nil, nil
	})))
	var p string
	select {
	case p = <-got:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: nothing consumed", what)
	}
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return p
}

// runToError runs a worker with a handler that does nothing on src, for a
// source that cannot start, and returns the error Run returns; it fails
// the test, naming what, when Run has not returned within 30s.
func runToError(t *testing.T, what, name string, src consumer.Source) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := worker(t, name, src, ignore).Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("%s: Run did not fail within 30s (it returned %v)", what, err)
	}
	return err
}

// record collects what handlers saw.
type record struct {
	mu       sync.Mutex
	seen     map[int][]int64        // partition → offsets in handling order
	finished map[int]map[int64]bool // partition → offsets whose handler returned nil
	byKey    map[string][]int       // message key → sequence numbers in order
	count    map[[2]int64]int       // (partition, offset) → runs
}

func newRecord() *record {
	return &record{seen: map[int][]int64{}, finished: map[int]map[int64]bool{}, byKey: map[string][]int{}, count: map[[2]int64]int{}}
}

func (r *record) start(m *consumer.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := m.Origin
	r.seen[o.Partition] = append(r.seen[o.Partition], o.Offset)
	r.count[[2]int64{int64(o.Partition), o.Offset}]++
	if len(m.Key) > 0 {
		n, _ := strconv.Atoi(string(m.Payload))
		r.byKey[string(m.Key)] = append(r.byKey[string(m.Key)], n)
	}
}

func (r *record) finish(m *consumer.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := m.Origin
	if r.finished[o.Partition] == nil {
		r.finished[o.Partition] = map[int64]bool{}
	}
	r.finished[o.Partition][o.Offset] = true
}

func (r *record) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.count)
}

func (r *record) runs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.count {
		n += c
	}
	return n
}

// allFinishedBelow reports whether every offset below committed[p] has
// finished, for every partition.
func (r *record) allFinishedBelow(committed map[int]int64) (int, int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, c := range committed {
		for o := int64(0); o < c; o++ {
			if !r.finished[p][o] {
				return p, o, false
			}
		}
	}
	return 0, 0, true
}

// reachedEnds reports whether the committed offsets equal ends.
func reachedEnds(committed, ends map[int]int64) bool {
	for p, end := range ends {
		if committed[p] != end {
			return false
		}
	}
	return true
}

// hdrs builds Kafka headers from name, value pairs.
func hdrs(kv ...string) []kafka.Header {
	var out []kafka.Header
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, kafka.Header{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return out
}
