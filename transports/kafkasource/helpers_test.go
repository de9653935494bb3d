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
	w := &kafka.Writer{
		Addr:         kafka.TCP(e.brokers...),
		Topic:        topic,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		BatchTimeout: time.Millisecond,
		BatchSize:    1000,
		RequiredAcks: kafka.RequireAll,
	}
	defer w.Close()
	out := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		out[i] = kafka.Message{Partition: m.partition, Value: []byte(m.value), Headers: m.headers}
		if m.key != "" {
			out[i].Key = []byte(m.key)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, out...); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
}

// committed returns the group's committed offset per partition (-1: none).
func (e *env) committed() map[int]int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	parts := make([]int, e.parts)
	for i := range parts {
		parts[i] = i
	}
	cl := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 10 * time.Second}
	resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: e.group, Topics: map[string][]int{e.topic: parts}})
	if err != nil {
		e.t.Errorf("offset fetch: %v", err)
		return nil
	}
	out := make(map[int]int64)
	for _, p := range resp.Topics[e.topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// ends returns the log-end offset of every partition of topic.
func (e *env) ends(topic string, partitions int) map[int]int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := range partitions {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
	}
	cl := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 10 * time.Second}
	resp, err := cl.ListOffsets(ctx, req)
	if err != nil {
		e.t.Fatalf("list offsets: %v", err)
	}
	out := make(map[int]int64)
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = p.LastOffset
	}
	return out
}

// readAll reads every message of topic's partitions from the start.
func (e *env) readAll(topic string, partitions int) []kafka.Message {
	e.t.Helper()
	ends := e.ends(topic, partitions)
	var out []kafka.Message
	for p := range partitions {
		if ends[p] == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				e.t.Fatalf("reading %s/%d: %v", topic, p, err)
			}
			out = append(out, m)
			if m.Offset+1 >= ends[p] {
				break
			}
		}
		cancel()
		r.Close()
	}
	return out
}

// run runs w until the test stops it (Stop) or ends.
func run(t *testing.T, w *consumer.Worker) *testenv.Running {
	t.Helper()
	return testenv.Go(t, w.Run)
}

func worker(t *testing.T, name string, src consumer.Source, h consumer.Handler, opts ...consumer.HandleOption) *consumer.Worker {
	t.Helper()
	w := consumer.NewWorker(consumer.Config{Logger: testenv.Logger(t), ShutdownTimeout: 10 * time.Second})
	if err := w.Handle(name, src, h, opts...); err != nil {
		t.Fatal(err)
	}
	return w
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

func testenvCreate(t *testing.T, e *env, topic string, partitions int) {
	t.Helper()
	testenv.CreateKafkaTopic(t, e.brokers, topic, partitions)
}
