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

// syncOnly hides PublishMsgAsync: ForwardNATS then publishes one message
// after another.
type syncOnly struct{ js jetstream.JetStream }

func (s syncOnly) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return s.js.PublishMsg(ctx, m, opts...)
}

func TestForwardNATSHeadersWithClaim(t *testing.T) {
	t.Run("async", func(t *testing.T) {
		testForwardNATSHeaders(t, func(js jetstream.JetStream) NATSPublisher { return js })
	})
	t.Run("sync", func(t *testing.T) {
		testForwardNATSHeaders(t, func(js jetstream.JetStream) NATSPublisher { return syncOnly{js} })
	})
}

func testForwardNATSHeaders(t *testing.T, publisher func(jetstream.JetStream) NATSPublisher) {
	nc, err := nats.Connect(testenv.NATS(t), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
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
