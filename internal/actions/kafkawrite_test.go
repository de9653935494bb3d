package actions

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// instantBroker is a kafka.RoundTripper that answers metadata (one topic of
// one partition) and produce requests at once, so that what a write takes
// is the writer's own waiting.
type instantBroker struct{ topic string }

func (b instantBroker) RoundTrip(_ context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	switch req.(type) {
	case *metadataAPI.Request:
		return &metadataAPI.Response{
			Brokers: []metadataAPI.ResponseBroker{{NodeID: 1, Host: "127.0.0.1", Port: 9092}},
			Topics: []metadataAPI.ResponseTopic{{Name: b.topic, Partitions: []metadataAPI.ResponsePartition{
				{PartitionIndex: 0, LeaderID: 1, ReplicaNodes: []int32{1}, IsrNodes: []int32{1}},
			}}},
		}, nil
	case *produceAPI.Request:
		return &produceAPI.Response{Topics: []produceAPI.ResponseTopic{{
			Topic: b.topic, Partitions: []produceAPI.ResponsePartition{{Partition: 0}},
		}}}, nil
	}
	return nil, fmt.Errorf("instantBroker: unexpected %T", req)
}

// A run handed to NewKafkaWriter's writer is produced when WriteMessages has
// added it, not after a linger: against a broker that answers at once, the
// fastest of 20 writes takes far less than a 2ms BatchTimeout, which every
// write of a lingering writer would wait out.
func TestNewKafkaWriterDoesNotLinger(t *testing.T) {
	w := NewKafkaWriter(kafka.TCP("127.0.0.1:9092"), "t", instantBroker{topic: "t"}, 5*time.Second)
	t.Cleanup(func() { w.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fastest := time.Hour
	for i := range 20 {
		start := time.Now()
		if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("k"), Value: fmt.Appendf(nil, "%d", i)}); err != nil {
			t.Fatal(err)
		}
		fastest = min(fastest, time.Since(start))
	}
	if fastest >= time.Millisecond {
		t.Fatalf("the fastest of 20 writes took %v: the writer lingers (BatchTimeout %v)", fastest, kafkaWriterBatchTimeout)
	}
}

// gatedWriter is a KafkaWriter whose calls block until the test releases
// them; it records each call's messages.
type gatedWriter struct {
	calls   chan []kafka.Message // each call's messages, when it starts
	release chan error           // what the oldest blocked call returns
}

func newGatedWriter() *gatedWriter {
	return &gatedWriter{calls: make(chan []kafka.Message, 16), release: make(chan error)}
}

func (g *gatedWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	g.calls <- append([]kafka.Message(nil), msgs...)
	select {
	case err := <-g.release:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gatedWriter) nextCall(t *testing.T) []kafka.Message {
	t.Helper()
	select {
	case msgs := <-g.calls:
		return msgs
	case <-time.After(10 * time.Second):
		t.Fatal("no write reached the writer within 10s")
		return nil
	}
}

func (g *gatedWriter) noCall(t *testing.T) {
	t.Helper()
	select {
	case msgs := <-g.calls:
		t.Fatalf("a write of %q reached the writer while the previous one was in flight", values(msgs))
	default:
	}
}

func values(msgs []kafka.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Value)
	}
	return out
}

func run(key string, vals ...string) []kafka.Message {
	out := make([]kafka.Message, len(vals))
	for i, v := range vals {
		out[i] = kafka.Message{Key: []byte(key), Value: []byte(v)}
	}
	return out
}

// waitQueued waits, up to 10s, until n runs queue in the single group of a
// writer without partitionHash.
func waitQueued(t *testing.T, c *coalescingWriter, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		got := len(c.pending[0])
		c.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs queued after 10s, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// asyncWrite calls WriteMessages on its own goroutine and returns its result
// channel.
func asyncWrite(ctx context.Context, c *coalescingWriter, msgs []kafka.Message) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- c.WriteMessages(ctx, msgs...) }()
	return ch
}

func result(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("WriteMessages did not return within 10s")
		return nil
	}
}

// A run that finds its partition idle is written at once and alone; runs
// that arrive while that write is in flight wait, then go together in one
// call, each contiguous and in its order.
func TestCoalescingWriterWritesAtOnceAndCoalescesWhileBusy(t *testing.T) {
	g := newGatedWriter()
	c := newCoalescingWriter(g)
	ctx := context.Background()
	first := asyncWrite(ctx, c, run("a", "a1", "a2"))
	if got := values(g.nextCall(t)); fmt.Sprint(got) != "[a1 a2]" {
		t.Fatalf("first call wrote %q, want the first run alone", got)
	}
	second := asyncWrite(ctx, c, run("b", "b1", "b2", "b3"))
	third := asyncWrite(ctx, c, run("c", "c1"))
	// Both queue behind the write in flight.
	waitQueued(t, c, 2)
	g.noCall(t)
	g.release <- nil
	if err := result(t, first); err != nil {
		t.Fatal(err)
	}
	got := values(g.nextCall(t))
	if s := fmt.Sprint(got); s != "[b1 b2 b3 c1]" && s != "[c1 b1 b2 b3]" {
		t.Fatalf("second call wrote %q, want both queued runs, each whole and in order", got)
	}
	g.release <- nil
	if err := errors.Join(result(t, second), result(t, third)); err != nil {
		t.Fatal(err)
	}
	// The call's goroutine frees its group after the callers have their
	// answers: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		busy, pending := len(c.busy), len(c.pending)
		c.mu.Unlock()
		if busy == 0 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d groups in a call and %d with queued runs 10s after every write returned", busy, pending)
		}
		time.Sleep(time.Millisecond)
	}
}

// Partitions do not wait for each other: with a write to one partition in
// flight, a run for another is written at once.
func TestCoalescingWriterPartitionsAreIndependent(t *testing.T) {
	g := newGatedWriter()
	c := newCoalescingWriter(g)
	c.hash = &partitionHash{}
	c.hash.n.Store(64)
	ka, kb := "", ""
	for i := 0; kb == ""; i++ {
		k := fmt.Sprintf("key-%d", i)
		switch {
		case ka == "":
			ka = k
		case c.groupOf([]byte(k), 64) != c.groupOf([]byte(ka), 64):
			kb = k
		}
	}
	ctx := context.Background()
	first := asyncWrite(ctx, c, run(ka, "a1"))
	g.nextCall(t)
	second := asyncWrite(ctx, c, run(kb, "b1"))
	if got := values(g.nextCall(t)); fmt.Sprint(got) != "[b1]" {
		t.Fatalf("second call wrote %q, want the other partition's run at once", got)
	}
	g.release <- nil
	g.release <- nil
	if err := errors.Join(result(t, first), result(t, second)); err != nil {
		t.Fatal(err)
	}
}

// A run holding a keyless message, which kafka.Hash may put in any
// partition, is written whole in one call, so its order holds in every
// partition; a keyed run's partitions go in parts.
func TestCoalescingWriterKeylessRunIsWrittenWhole(t *testing.T) {
	g := newGatedWriter()
	c := newCoalescingWriter(g)
	c.hash = &partitionHash{}
	c.hash.n.Store(64)
	mixed := append(run("k1", "m1"), kafka.Message{Value: []byte("m2")}, kafka.Message{Key: []byte("k2"), Value: []byte("m3")})
	done := asyncWrite(context.Background(), c, mixed)
	if got := values(g.nextCall(t)); fmt.Sprint(got) != "[m1 m2 m3]" {
		t.Fatalf("call wrote %q, want the whole run in order", got)
	}
	g.release <- nil
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
}

// Each caller gets its own messages' errors from a coalesced call, at their
// indexes in its run, whether kafka-go failed single messages or the whole
// call.
func TestCoalescingWriterErrorsPerCaller(t *testing.T) {
	g := newGatedWriter()
	c := newCoalescingWriter(g)
	ctx := context.Background()
	first := asyncWrite(ctx, c, run("a", "a1"))
	g.nextCall(t)
	second := asyncWrite(ctx, c, run("b", "b1", "b2"))
	third := asyncWrite(ctx, c, run("c", "c1", "c2"))
	waitQueued(t, c, 2)
	broken := errors.New("boom")
	g.release <- broken
	var werrs kafka.WriteErrors
	if err := result(t, first); !errors.As(err, &werrs) || len(werrs) != 1 || !errors.Is(werrs[0], broken) {
		t.Fatalf("first run: %v, want WriteErrors [boom]", err)
	}
	got := g.nextCall(t)
	// Fail the second message of each coalesced run.
	perMsg := make(kafka.WriteErrors, len(got))
	for i, m := range got {
		if v := string(m.Value); v == "b2" || v == "c2" {
			perMsg[i] = fmt.Errorf("failed %s", v)
		}
	}
	g.release <- perMsg
	for name, ch := range map[string]<-chan error{"b": second, "c": third} {
		err := result(t, ch)
		if !errors.As(err, &werrs) || len(werrs) != 2 || werrs[0] != nil || werrs[1] == nil || werrs[1].Error() != "failed "+name+"2" {
			t.Fatalf("run %s: %v, want WriteErrors [nil, failed %s2]", name, err, name)
		}
	}
}

// When kafka-go fails a coalesced call as a whole (as it refuses a call with
// one message over BatchBytes before writing any), each caller's share is
// written again alone, so a caller fails only for its own messages.
func TestCoalescingWriterWholeCallErrorIsolatesCallers(t *testing.T) {
	g := newGatedWriter()
	c := newCoalescingWriter(g)
	ctx := context.Background()
	first := asyncWrite(ctx, c, run("a", "a1"))
	g.nextCall(t)
	good := asyncWrite(ctx, c, run("b", "b1"))
	bad := asyncWrite(ctx, c, run("c", "too-large"))
	waitQueued(t, c, 2)
	g.release <- nil
	if err := result(t, first); err != nil {
		t.Fatal(err)
	}
	if got := g.nextCall(t); len(got) != 2 {
		t.Fatalf("coalesced call wrote %q, want both queued runs", values(got))
	}
	tooLarge := errors.New("message too large")
	g.release <- tooLarge
	// Each run again alone, in queue order unknown: answer by content.
	for range 2 {
		got := values(g.nextCall(t))
		switch fmt.Sprint(got) {
		case "[b1]":
			g.release <- nil
		case "[too-large]":
			g.release <- tooLarge
		default:
			t.Fatalf("retry wrote %q, want one run alone", got)
		}
	}
	if err := result(t, good); err != nil {
		t.Fatalf("the run without the large message: %v, want written", err)
	}
	var werrs kafka.WriteErrors
	if err := result(t, bad); !errors.As(err, &werrs) || !errors.Is(werrs[0], tooLarge) {
		t.Fatalf("the run with the large message: %v, want its error", err)
	}
}

// A caller that leaves before its run is taken gets its context's cause and
// its messages are not written.
func TestCoalescingWriterDropsRunsOfCallersThatLeft(t *testing.T) {
	g := newGatedWriter()
	c := newCoalescingWriter(g)
	first := asyncWrite(context.Background(), c, run("a", "a1"))
	g.nextCall(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	gone := errors.New("caller stopped")
	left := asyncWrite(ctx, c, run("b", "b1"))
	waitQueued(t, c, 1)
	cancel(gone)
	if err := result(t, left); !errors.Is(err, gone) {
		t.Fatalf("left caller: %v, want its context's cause", err)
	}
	g.release <- nil
	if err := result(t, first); err != nil {
		t.Fatal(err)
	}
	later := asyncWrite(context.Background(), c, run("c", "c1"))
	if got := values(g.nextCall(t)); fmt.Sprint(got) != "[c1]" {
		t.Fatalf("next call wrote %q, want only the run of a caller still waiting", got)
	}
	g.release <- nil
	if err := result(t, later); err != nil {
		t.Fatal(err)
	}
}

// Through NewKafkaWriter on real Kafka, concurrent callers' runs with keys
// over every partition all arrive, in the partition kafka.Hash names, and
// each caller's messages of one partition in the order it wrote them.
func TestForwardKafkaCoalescedWritesKeepOrder(t *testing.T) {
	brokers := testenv.RealKafka(t)
	topic := "actions-coalesce-" + randomSuffix(t)
	const partitions, callers, runs, perRun = 4, 6, 10, 20
	testenv.CreateKafkaTopic(t, brokers, topic, partitions)
	w := NewKafkaWriter(kafka.TCP(brokers...), topic, nil, 10*time.Second)
	t.Cleanup(func() { w.Close() })
	c := newCoalescingWriter(w)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, callers)
	for cl := range callers {
		wg.Go(func() {
			for r := range runs {
				msgs := make([]kafka.Message, perRun)
				for i := range msgs {
					seq := r*perRun + i
					msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "c%d-k%d", cl, seq%7), Value: fmt.Appendf(nil, "%d/%d", cl, seq)}
				}
				if err := c.WriteMessages(ctx, msgs...); err != nil {
					errs[cl] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var hash kafka.Hash
	parts := []int{0, 1, 2, 3}
	total := 0
	for p := range partitions {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		end, err := lastOffset(ctx, brokers, topic, p)
		if err != nil {
			t.Fatal(err)
		}
		last := map[int]int{}
		for off := int64(0); off < end; off++ {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatalf("partition %d offset %d: %v", p, off, err)
			}
			if want := hash.Balance(kafka.Message{Key: m.Key}, parts...); want != p {
				t.Errorf("key %s in partition %d, kafka.Hash says %d", m.Key, p, want)
			}
			var cl, seq int
			if _, err := fmt.Sscanf(string(m.Value), "%d/%d", &cl, &seq); err != nil {
				t.Fatalf("value %q: %v", m.Value, err)
			}
			if prev, ok := last[cl]; ok && seq <= prev {
				t.Errorf("partition %d: caller %d's message %d after its %d", p, cl, seq, prev)
			}
			last[cl] = seq
			total++
		}
		r.Close()
	}
	if want := callers * runs * perRun; total != want {
		t.Fatalf("%d messages arrived, want %d", total, want)
	}
}

func lastOffset(ctx context.Context, brokers []string, topic string, partition int) (int64, error) {
	conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, partition)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn.ReadLastOffset()
}

// Every message count gets the writer with the smallest BatchSize that
// holds it (a power of two up to 64, then kafkaFlightMessages), and counts
// beyond kafkaFlightMessages the largest.
func TestBatchClassOfHoldsTheCount(t *testing.T) {
	for n := 0; n <= 3*kafkaFlightMessages; n++ {
		i := batchClassOf(n)
		if i < 0 || i >= batchClasses {
			t.Fatalf("batchClassOf(%d) = %d, outside 0..%d", n, i, batchClasses-1)
		}
		size := batchSizeOf(i)
		if size < min(max(n, 1), kafkaFlightMessages) {
			t.Errorf("%d messages: BatchSize %d does not hold them", n, size)
		}
		if i > 0 && batchSizeOf(i-1) >= n {
			t.Errorf("%d messages: BatchSize %d chosen, %d holds them", n, size, batchSizeOf(i-1))
		}
	}
	if got := batchSizeOf(batchClasses - 1); got != kafkaFlightMessages {
		t.Errorf("the largest BatchSize is %d, want kafkaFlightMessages (%d)", got, kafkaFlightMessages)
	}
}

// produceCounter is a kafka.RoundTripper that counts the produce requests
// it passes on to kafka-go's default transport.
type produceCounter struct {
	mu       sync.Mutex
	produces int
}

func (p *produceCounter) RoundTrip(ctx context.Context, addr net.Addr, req protocol.Message) (protocol.Message, error) {
	if _, ok := req.(*produceAPI.Request); ok {
		p.mu.Lock()
		p.produces++
		p.mu.Unlock()
	}
	return kafka.DefaultTransport.RoundTrip(ctx, addr, req)
}

func (p *produceCounter) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.produces
}

// readPartition returns the values of partition p of topic, in order.
func readPartition(ctx context.Context, t *testing.T, brokers []string, topic string, p int) []string {
	t.Helper()
	end, err := lastOffset(ctx, brokers, topic, p)
	if err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	var vals []string
	for off := int64(0); off < end; off++ {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("partition %d offset %d: %v", p, off, err)
		}
		vals = append(vals, string(m.Value))
	}
	return vals
}

// On real Kafka, a call of NewKafkaWriter's writer with any number of
// messages for one partition, up to kafkaFlightMessages, is one produce
// request, whichever BatchSize it is written with; a call with more is
// split into produce requests of up to kafkaFlightMessages; the messages
// arrive in order.
func TestKafkaBatchWriterOneProducePerPartitionCall(t *testing.T) {
	brokers := testenv.RealKafka(t)
	topic := "actions-sized-" + randomSuffix(t)
	testenv.CreateKafkaTopic(t, brokers, topic, 1)
	pc := &produceCounter{}
	w := NewKafkaWriter(kafka.TCP(brokers...), topic, pc, 10*time.Second)
	t.Cleanup(func() { w.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A first write outlasts the new partition's leader election: a
	// produce that finds no leader yet is retried and would count twice.
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("k"), Value: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	want := []string{"first"}
	for _, n := range []int{1, 2, 3, 5, 17, 64, 65, 100, 101, 250} {
		msgs := make([]kafka.Message, n)
		for i := range msgs {
			msgs[i] = kafka.Message{Key: []byte("k"), Value: fmt.Appendf(nil, "%d/%d", n, i)}
			want = append(want, string(msgs[i].Value))
		}
		before := pc.count()
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatalf("%d messages: %v", n, err)
		}
		wantProduces := (n + kafkaFlightMessages - 1) / kafkaFlightMessages
		if got := pc.count() - before; got != wantProduces {
			t.Errorf("%d messages for one partition: %d produce requests, want %d", n, got, wantProduces)
		}
	}
	if got := readPartition(ctx, t, brokers, topic, 0); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("partition 0 holds %d messages %v,\nwant %d %v", len(got), got, len(want), want)
	}
}

// On real Kafka, one run whose messages go to four partitions in unequal
// numbers is one coalesced call, sized for its largest share, and so one
// produce request per partition, each partition's messages in order.
func TestCoalescingWriterSizesTheCallForItsLargestPartition(t *testing.T) {
	brokers := testenv.RealKafka(t)
	topic := "actions-sizedrun-" + randomSuffix(t)
	const partitions = 4
	testenv.CreateKafkaTopic(t, brokers, topic, partitions)
	pc := &produceCounter{}
	w := NewKafkaWriter(kafka.TCP(brokers...), topic, pc, 10*time.Second)
	t.Cleanup(func() { w.Close() })
	c := newCoalescingWriter(w)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The first writes, one to each partition, teach the writer's balancer
	// the partition count and outlast the new topic's leader elections (a
	// produce that finds no leader yet is retried, and would count twice
	// below); then the writers' counters are read, which resets them.
	var hash kafka.Hash
	parts := []int{0, 1, 2, 3}
	var want [partitions][]string
	for p, k := 0, 0; p < partitions; k++ {
		key := fmt.Appendf(nil, "first%d", k)
		if hash.Balance(kafka.Message{Key: key}, parts...) != p {
			continue
		}
		if err := c.WriteMessages(ctx, kafka.Message{Key: key, Value: key}); err != nil {
			t.Fatal(err)
		}
		want[p] = append(want[p], string(key))
		p++
	}
	for _, kw := range w.sized {
		kw.Stats()
	}
	wantPer := [partitions]int{3, 9, 40, 70}
	var msgs []kafka.Message
	var have [partitions]int
	for k := 0; have != wantPer; k++ {
		key := fmt.Appendf(nil, "k%d", k)
		p := hash.Balance(kafka.Message{Key: key}, parts...)
		if have[p] == wantPer[p] {
			continue
		}
		have[p]++
		m := kafka.Message{Key: key, Value: fmt.Appendf(nil, "%d/%d", p, have[p])}
		msgs = append(msgs, m)
		want[p] = append(want[p], string(m.Value))
	}
	before := pc.count()
	if err := c.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if got := pc.count() - before; got != partitions {
		t.Errorf("a run of %v messages over %d partitions took %d produce requests, want %d", wantPer, partitions, got, partitions)
	}
	if got := writtenBy(w, 70); got != int64(len(msgs)) {
		t.Errorf("the writer of BatchSize %d wrote %d messages, want the run's %d", batchSizeOf(batchClassOf(70)), got, len(msgs))
	}

	// A keyless run: 40 messages without a key, spread round-robin (10 per
	// partition), and 10 with key "x", all in x's partition, which so gets
	// 20: one produce request per partition, from the writer sized for 20.
	var run []kafka.Message
	xp := hash.Balance(kafka.Message{Key: []byte("x")}, parts...)
	for i := range 50 {
		m := kafka.Message{Value: fmt.Appendf(nil, "keyless/%d", i)}
		if i%5 == 4 {
			m.Key = []byte("x")
			want[xp] = append(want[xp], string(m.Value))
		}
		run = append(run, m)
	}
	before = pc.count()
	if err := c.WriteMessages(ctx, run...); err != nil {
		t.Fatal(err)
	}
	if got := pc.count() - before; got != partitions {
		t.Errorf("a run of 40 keyless and 10 keyed messages over %d partitions took %d produce requests, want %d", partitions, got, partitions)
	}
	if got := writtenBy(w, 20); got != int64(len(run)) {
		t.Errorf("the writer of BatchSize %d wrote %d messages, want the keyless run's %d", batchSizeOf(batchClassOf(20)), got, len(run))
	}
	for p := range partitions {
		var got []string
		for _, v := range readPartition(ctx, t, brokers, topic, p) {
			// The keyless messages' partitions are the balancer's turns;
			// only the keyed ones have a partition to check.
			if !strings.HasPrefix(v, "keyless/") || slices.Contains(want[p], v) {
				got = append(got, v)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want[p]) {
			t.Errorf("partition %d holds %v,\nwant %v", p, got, want[p])
		}
	}
}

// writtenBy returns how many messages w's writer for calls of n messages per
// partition wrote since the last call (kafka.Writer's Stats resets them).
func writtenBy(w *KafkaBatchWriter, n int) int64 {
	return w.sized[batchClassOf(n)].Stats().Messages
}

// Close closes every writer of a KafkaBatchWriter: afterwards a call of any
// size fails as a closed kafka.Writer's does.
func TestKafkaBatchWriterCloseClosesEveryWriter(t *testing.T) {
	w := NewKafkaWriter(kafka.TCP("127.0.0.1:9092"), "t", instantBroker{topic: "t"}, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range batchClasses {
		n := batchSizeOf(i)
		msgs := make([]kafka.Message, n)
		for j := range msgs {
			msgs[j] = kafka.Message{Key: []byte("k"), Value: []byte("v")}
		}
		if err := w.WriteMessages(ctx, msgs...); !errors.Is(err, io.ErrClosedPipe) {
			t.Errorf("%d messages after Close: %v, want io.ErrClosedPipe", n, err)
		}
	}
}

// A run is grouped over one partition count: while the count the writer
// saw changes under it (as at its first write), every run is either one
// group (the count read was 0) or grouped by partition, never part of each,
// which would put one partition's messages of the run in two calls.
func TestCoalescingWriterGroupsARunOverOneCount(t *testing.T) {
	c := newCoalescingWriter(newGatedWriter())
	c.hash = &partitionHash{}
	msgs := make([]kafka.Message, 20)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "k%d", i)}
	}
	want := make([]int, len(msgs))
	for i := range msgs {
		want[i] = c.groupOf(msgs[i].Key, 4)
	}
	stop := make(chan struct{})
	var flips sync.WaitGroup
	flips.Go(func() {
		for n := int32(0); ; n = 4 - n {
			select {
			case <-stop:
				return
			default:
				c.hash.n.Store(n)
			}
		}
	})
	defer func() { close(stop); flips.Wait() }()
	for range 20_000 {
		groups, one := c.groupRun(msgs)
		if one {
			if groups[0] != 0 {
				t.Fatalf("one group %d, want 0", groups[0])
			}
			continue
		}
		if fmt.Sprint(groups) != fmt.Sprint(want) {
			t.Fatalf("groups %v, want all 0 or %v", groups, want)
		}
	}
}
