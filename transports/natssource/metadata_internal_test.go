package natssource

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestAckMetadata reads the delivery count and stream sequence from the
// reply subjects JetStream servers send, in both forms, and refuses other
// subjects, as jetstream.Msg.Metadata does.
func TestAckMetadata(t *testing.T) {
	for _, c := range []struct {
		reply                   string
		delivered, seq, pending uint64
		ok                      bool
	}{
		{"$JS.ACK.ORDERS.relay.3.1042.977.1764590000000000000.12", 3, 1042, 12, true},
		{"$JS.ACK._.AccHash.ORDERS.relay.1.7.7.1764590000000000000.0.rnd", 1, 7, 0, true},
		{"$JS.ACK.hub.AccHash.ORDERS.relay.2.18446744073709551615.9.1764590000000000000.31.rnd", 2, 18446744073709551615, 31, true},
		{"$JS.ACK.hub.AccHash.ORDERS.relay.5.99.9.1764590000000000000.4.rnd.extra", 5, 99, 4, true},
		{"$JS.ACK.ORDERS.relay.x1.12.9.1764590000000000000.0", 0, 12, 0, true},
		{"$JS.ACK.ORDERS.relay.3.1042.977.1764590000000000000", 0, 0, 0, false},       // 8 tokens
		{"$JS.ACK.hub.ORDERS.relay.3.1042.977.1764590000000000000.0", 0, 0, 0, false}, // 10 tokens
		{"_INBOX.abc.ORDERS.relay.3.1042.977.1764590000000000000.12", 0, 0, 0, false}, // not an ack subject
		{"", 0, 0, 0, false},
	} {
		delivered, seq, pending, ok := ackMetadata(c.reply)
		if delivered != c.delivered || seq != c.seq || pending != c.pending || ok != c.ok {
			t.Errorf("ackMetadata(%q) = %d, %d, %d, %v; want %d, %d, %d, %v", c.reply, delivered, seq, pending, ok, c.delivered, c.seq, c.pending, c.ok)
		}
	}
}

// TestAckMetadataAgreesWithJetStream compares ackMetadata with
// jetstream.Msg.Metadata on messages the servers deliver, a first delivery
// and a redelivery.
func TestAckMetadataAgreesWithJetStream(t *testing.T) {
	for _, srv := range testenv.NATSServers() {
		t.Run(srv.Name, func(t *testing.T) {
			nc, err := nats.Connect(srv.URL(t), nats.Timeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			name := testenv.UniqueName(t, "MD")
			subj := strings.ToLower(name)
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, Storage: jetstream.MemoryStorage}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
			for range 3 {
				if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
					t.Fatal(err)
				}
			}
			cons, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "md", AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				t.Fatal(err)
			}
			check := func(m jetstream.Msg) {
				t.Helper()
				md, err := m.Metadata()
				if err != nil {
					t.Fatal(err)
				}
				delivered, seq, pending, ok := ackMetadata(m.Reply())
				if !ok || delivered != md.NumDelivered || seq != md.Sequence.Stream || pending != md.NumPending {
					t.Fatalf("ackMetadata(%q) = %d, %d, %d, %v; jetstream reads delivered %d, stream sequence %d, pending %d", m.Reply(), delivered, seq, pending, ok, md.NumDelivered, md.Sequence.Stream, md.NumPending)
				}
			}
			for round := 1; round <= 2; round++ {
				batch, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				// Settled once the fetch is over: a message nakked while the
				// fetch still waits for its third could come back in it.
				var got []jetstream.Msg
				for m := range batch.Messages() {
					check(m)
					if md, _ := m.Metadata(); int(md.NumDelivered) != round {
						t.Fatalf("round %d: message delivered %d times", round, md.NumDelivered)
					}
					got = append(got, m)
				}
				if len(got) != 3 {
					t.Fatalf("round %d: fetched %d messages, want 3 (%v)", round, len(got), batch.Error())
				}
				for _, m := range got {
					if round == 1 {
						_ = m.Nak()
					} else {
						_ = m.Ack()
					}
				}
			}
		})
	}
}

// replyMsg is a message with a payload and a reply subject; its other
// methods are the embedded nil interface's (a call panics).
type replyMsg struct {
	jetstream.Msg
	reply string
}

func (m replyMsg) Data() []byte         { return []byte("x") }
func (m replyMsg) Headers() nats.Header { return nil }
func (m replyMsg) Subject() string      { return "orders.1" }
func (m replyMsg) Reply() string        { return m.reply }

// TestDeliveryRecordsPending: every message received sets the backlog
// Pending reports from its metadata, the newest message's count winning.
func TestDeliveryRecordsPending(t *testing.T) {
	s := &Source{}
	var d delivery
	for _, c := range []struct {
		reply   string
		pending uint64
	}{
		{"$JS.ACK.ORDERS.relay.1.41.41.1764590000000000000.12", 12},
		{"$JS.ACK.ORDERS.relay.1.42.42.1764590000000000000.11", 11},
		{"$JS.ACK._.AccHash.ORDERS.relay.2.7.43.1764590000000000000.0.rnd", 0},
	} {
		before := time.Now()
		s.initDelivery(&d, replyMsg{reply: c.reply})
		p, ok := s.Pending()
		if !ok || p.Messages != c.pending || p.Seen.Before(before.Truncate(time.Microsecond)) {
			t.Fatalf("after a delivery with reply %q: Pending = %+v, %v; want %d seen from %v", c.reply, p, ok, c.pending, before)
		}
	}
}
