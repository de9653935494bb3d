package actions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

func randomSuffix(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// claimed runs h through the deduplication engine over real Redis, so that
// every message runs with a claim in its context. The key comes from the
// payload's "id", not from the incoming Idempotency-Key header, which the
// action must replace. The first delivery runs alone (Handle), the rest as
// one run (HandleBatch).
func claimed(t *testing.T, h consumer.Handler, ids []string) []*consumertest.Delivery {
	t.Helper()
	store, err := redisbackend.New(testenv.RedisClient(t), redisbackend.Options{Namespace: "actionstest-" + randomSuffix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	eng, err := idempotency.New(store, idempotency.Config{StoreTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	dedup, err := eng.Processor(idempotency.WithKeySources(idempotency.JSONKey("id")))
	if err != nil {
		t.Fatal(err)
	}
	p := dedup("relay", h)
	fds := make([]*consumertest.Delivery, len(ids))
	ds := make([]consumer.Delivery, len(ids))
	for i, id := range ids {
		d := consumertest.NewDelivery(consumertest.NewMessage("", fmt.Sprintf(`{"id":%q}`, id)), 1)
		d.Message().Key = []byte("customer-" + id)
		d.Message().Header = consumer.Header{
			"idempotency-key": {"stale-" + id},
			"nats-msg-id":     {"stale-" + id},
			"Traceparent":     {"00-abc"},
		}
		fds[i], ds[i] = d, d
	}
	ctx := context.Background()
	p.Prepare(ctx, ds)
	p.Process(ctx, ds[0])
	p.ProcessBatch(ctx, ds[1:])
	for _, d := range fds {
		d.ExpectAcked(t)
	}
	return fds
}

// headerValues returns every value of name, matched in any case.
func headerValues(h map[string][]string, name string) []string {
	var vs []string
	for k, v := range h {
		if strings.EqualFold(k, name) {
			vs = append(vs, v...)
		}
	}
	return vs
}

func checkForwardedHeaders(t *testing.T, id string, h map[string][]string) {
	t.Helper()
	if got := headerValues(h, IdempotencyHeader); len(got) != 1 || got[0] != id {
		t.Errorf("message %s: Idempotency-Key values %q, want exactly [%s]: the claim's key replaces the incoming header of any case", id, got, id)
	}
	if got := headerValues(h, "Traceparent"); len(got) != 1 || got[0] != "00-abc" {
		t.Errorf("message %s: Traceparent %q, want the incoming one", id, got)
	}
}

func TestForwardKafkaHeadersWithClaim(t *testing.T) {
	brokers := testenv.RealKafka(t)
	topic := "actions-fwd-" + randomSuffix(t)
	testenv.CreateKafkaTopic(t, brokers, topic, 1)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: 2 * time.Millisecond}
	t.Cleanup(func() { w.Close() })
	ids := []string{"o1", "o2", "o3", "o4"}
	claimed(t, ForwardKafka("relay", w, nil), ids)

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { r.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, id := range ids {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("reading forwarded message %d: %v", i, err)
		}
		if string(m.Key) != "customer-"+id || string(m.Value) != fmt.Sprintf(`{"id":%q}`, id) {
			t.Fatalf("forwarded #%d key %q value %q, want %s's, in order", i, m.Key, m.Value, id)
		}
		h := map[string][]string{}
		for _, kh := range m.Headers {
			h[kh.Key] = append(h[kh.Key], string(kh.Value))
		}
		checkForwardedHeaders(t, id, h)
	}
}

// syncOnly hides the NATSJetStream: ForwardNATS then publishes one message
// after another.
type syncOnly struct{ js jetstream.JetStream }

func (s syncOnly) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return s.js.PublishMsg(ctx, m, opts...)
}

func TestForwardNATSHeadersWithClaim(t *testing.T) {
	t.Run("async", func(t *testing.T) {
		testForwardNATSHeaders(t, func(js *NATSJetStream) NATSPublisher { return js })
	})
	t.Run("sync", func(t *testing.T) {
		testForwardNATSHeaders(t, func(js *NATSJetStream) NATSPublisher { return syncOnly{js} })
	})
}

func testForwardNATSHeaders(t *testing.T, publisher func(*NATSJetStream) NATSPublisher) {
	js := natsJetStream(t, testenv.NATS(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "ACTFWD" + strings.ToUpper(randomSuffix(t))
	subject := "actfwd." + name
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Duplicates: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	ids := []string{"n1", "n2", "n3"}
	claimed(t, ForwardNATS("relay", publisher(js), subject, nil), ids)

	for i, id := range ids {
		raw, err := stream.GetMsg(ctx, uint64(i+1))
		if err != nil {
			t.Fatalf("stream message %d: %v", i+1, err)
		}
		if string(raw.Data) != fmt.Sprintf(`{"id":%q}`, id) {
			t.Fatalf("stream message %d is %q, want %s's", i+1, raw.Data, id)
		}
		checkForwardedHeaders(t, id, raw.Header)
		if got := headerValues(raw.Header, nats.MsgIdHdr); len(got) != 1 || got[0] != id {
			t.Errorf("message %s: Nats-Msg-Id values %q, want exactly [%s]", id, got, id)
		}
	}
	// The JetStream duplicate window knows the keys: forwarding again
	// stores nothing new.
	msg := nats.NewMsg(subject)
	msg.Data = []byte("again")
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(ids[1]))
	if err != nil || !ack.Duplicate {
		t.Fatalf("republishing %s: %+v %v, want a duplicate", ids[1], ack, err)
	}
}

// isIdempotencyHeader matches Idempotency-Key in any case, as
// consumer.Header.Set does, and nothing else.
func TestIsIdempotencyHeader(t *testing.T) {
	for name, want := range map[string]bool{
		"Idempotency-Key": true, "idempotency-key": true, "IDEMPOTENCY-KEY": true, "idempotency-KEY": true,
		"Idempotency-Kez": false, "Idempotency-Ke": false, "Idempotency-Keys": false, "Idempotency Key": false, "": false,
	} {
		if got := isIdempotencyHeader(name); got != want {
			t.Errorf("isIdempotencyHeader(%q) = %v, want %v", name, got, want)
		}
		h := consumer.Header{name: {"v"}}
		h.Set(IdempotencyHeader, "k")
		if _, kept := h[name]; name != IdempotencyHeader && kept == want {
			t.Errorf("Header.Set(Idempotency-Key) kept %q: %v; isIdempotencyHeader says %v, they must agree", name, kept, want)
		}
	}
}

// TestNATSOutgoingLeavesTheIncomingHeaders checks the header map ForwardNATS
// publishes, which shares the incoming value slices: the incoming message is
// unchanged, an append to an outgoing value does not reach it, names are
// replaced in any case only when there is a key, and an injected header
// replaces an incoming one of its name.
func TestNATSOutgoingLeavesTheIncomingHeaders(t *testing.T) {
	in := consumer.Header{
		"idempotency-KEY": {"stale"},
		"NATS-MSG-ID":     {"stale"},
		"Tag":             make([]string, 1, 4),
		"traceparent":     {"00-old"},
	}
	in["Tag"][0] = "a"
	m := &consumer.Message{Header: in}
	inject := Injector(func(_ context.Context, h consumer.Header) { h.Set("Traceparent", "00-new") })

	h := natsOutgoing(context.Background(), m, "k1", inject)
	want := nats.Header{"Idempotency-Key": {"k1"}, nats.MsgIdHdr: {"k1"}, "Tag": {"a"}, "Traceparent": {"00-new"}}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Fatalf("outgoing headers %v, want %v", h, want)
	}
	h["Tag"] = append(h["Tag"], "b")
	h[nats.MsgIdHdr] = append(h[nats.MsgIdHdr], "x")
	if got := in["Tag"][:cap(in["Tag"])][1]; got != "" {
		t.Fatalf("an append to the outgoing Tag wrote %q into the incoming value's array", got)
	}
	if got := h.Values(IdempotencyHeader); len(got) != 1 || got[0] != "k1" {
		t.Fatalf("Idempotency-Key %q after an append to Nats-Msg-Id, want [k1]: the two must not share room to grow", got)
	}
	wantIn := consumer.Header{"idempotency-KEY": {"stale"}, "NATS-MSG-ID": {"stale"}, "Tag": {"a"}, "traceparent": {"00-old"}}
	if fmt.Sprint(in) != fmt.Sprint(wantIn) {
		t.Fatalf("incoming headers became %v, want %v", in, wantIn)
	}

	// Without a claim nothing is replaced: the incoming Nats-Msg-Id goes on.
	h = natsOutgoing(context.Background(), m, "", nil)
	if got := h.Get("NATS-MSG-ID"); got != "stale" || len(h) != len(in) {
		t.Fatalf("without a key the headers are %v, want the incoming ones", h)
	}
}

// resultBlock's results are "<stream>:<sequence>" each, correct when a
// later ack's stream name no longer fits the block (a new one is made), and
// clipped: appending to one leaves the next as it was.
func TestResultBlock(t *testing.T) {
	r := resultBlock{left: 4}
	acks := []*jetstream.PubAck{
		{Stream: "OUT", Sequence: 1},
		{Stream: "OUT", Sequence: 18446744073709551615},
		{Stream: "A-MUCH-LONGER-STREAM-NAME-THAN-THE-BLOCK-HAS-ROOM-FOR", Sequence: 3},
	}
	want := []string{"OUT:1", "OUT:18446744073709551615", "A-MUCH-LONGER-STREAM-NAME-THAN-THE-BLOCK-HAS-ROOM-FOR:3"}
	got := make([][]byte, len(acks))
	for i, a := range acks {
		got[i] = r.add(a.Stream, a.Sequence)
	}
	r.left-- // the fourth message failed
	if r.left != 0 {
		t.Errorf("left %d after every result, want 0", r.left)
	}
	_ = append(got[0], "overwritten"...)
	for i, g := range got {
		if string(g) != want[i] {
			t.Errorf("result %d: %q, want %q", i, g, want[i])
		}
		if cap(g) != len(g) {
			t.Errorf("result %d: cap %d, len %d: not clipped", i, cap(g), len(g))
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		r := resultBlock{left: 64}
		for range 64 {
			_ = r.add(acks[0].Stream, acks[0].Sequence)
		}
	}); n != 1 {
		t.Errorf("%v allocations for a run of 64 results of one stream, want 1", n)
	}
}
