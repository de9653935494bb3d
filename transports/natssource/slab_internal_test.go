package natssource

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/internal/bytebudget"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestReceiverDeliverySlab: the deliveries of the messages waiting in the
// receiver come from one slab sized to what is waiting (and to the room
// left in the batch), each filled from its own message.
func TestReceiverDeliverySlab(t *testing.T) {
	st := testenv.NewNATSStream(t, testenv.NATS(t), "SLAB")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 5
	for i := range n {
		if _, err := st.JS.Publish(ctx, st.Subject+".x", fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := st.JS.CreateConsumer(ctx, st.Name, jetstream.ConsumerConfig{Durable: "slab", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != n {
		t.Fatalf("fetched %d messages, want %d (%v)", len(msgs), n, batch.Error())
	}
	s, err := New(st.JS, Config{Stream: st.Name, Consumer: "slab"})
	if err != nil {
		t.Fatal(err)
	}
	buf := bytebudget.New(1 << 20)
	rcv := make([]received, n)
	var total int64
	for i, m := range msgs {
		rcv[i] = received{msg: m, cost: messageCost(m)}
		total += rcv[i].cost
		if err := buf.Acquire(ctx, rcv[i].cost); err != nil {
			t.Fatal(err)
		}
	}
	rc := newReceiver(s, cons, buf, 8, 8)
	for _, r := range rcv[1:] {
		rc.in <- r
	}
	// Four waiting, room for three in the batch: a slab of three.
	first := rc.delivery(rcv[0], 3)
	if len(rc.spare) != 2 {
		t.Fatalf("%d spare deliveries after the first of a slab for 3, want 2", len(rc.spare))
	}
	ds := rc.takeBuffered(nil, nil, 2)
	if len(ds) != 2 || len(rc.spare) != 0 {
		t.Fatalf("took %d buffered, %d spare left; want 2 and 0", len(ds), len(rc.spare))
	}
	// Two still waiting, room for six: the next slab holds exactly those.
	ds = rc.takeBuffered(ds, nil, 8)
	if len(ds) != 4 || len(rc.spare) != 0 || len(rc.in) != 0 {
		t.Fatalf("took %d buffered, %d spare, %d waiting; want 4, 0, 0 (a slab of the 2 waiting)", len(ds), len(rc.spare), len(rc.in))
	}
	all := append([]*delivery{first}, ds[0].(*delivery), ds[1].(*delivery), ds[2].(*delivery), ds[3].(*delivery))
	for i, d := range all {
		m := d.Message()
		if string(m.Payload) != fmt.Sprintf("m%d", i) || m.Origin.Offset != int64(i+1) || d.Attempt() != 1 || d.msg != msgs[i] {
			t.Errorf("delivery %d: payload %q, offset %d, attempt %d; want m%d, %d, 1", i, m.Payload, m.Origin.Offset, d.Attempt(), i, i+1)
		}
		if m != &d.message {
			t.Errorf("delivery %d: Message is not its own", i)
		}
		if err := d.Ack(ctx); err != nil {
			t.Errorf("delivery %d: ack: %v", i, err)
		}
		total -= rcv[i].cost
		if held := buf.Stats().Held; held != total {
			t.Errorf("after the ack of delivery %d the bound holds %d, want %d: the ack gives back exactly its message's cost", i, held, total)
		}
	}
	// A settled delivery gives nothing back twice.
	_ = all[0].Nak(ctx, 0)
	if held := buf.Stats().Held; held != 0 {
		t.Errorf("the bound holds %d after every delivery was settled and one nakked again, want 0", held)
	}
}
