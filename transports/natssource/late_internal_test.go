package natssource

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/internal/bytebudget"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// nakCounter is a message that counts its naks. Its other methods are the
// embedded nil interface's: calling one fails the test with a panic.
type nakCounter struct {
	jetstream.Msg
	naks atomic.Int32
}

func (m *nakCounter) Nak() error { m.naks.Add(1); return nil }

// TestLateSendIsNakked: a callback that hands a message on after Consume's
// end took what was waiting (its drain timed out, so the callback still
// runs) must not leave it in the receiver's queue, where nobody takes it
// and the server redelivers it only after AckWait. Both of send's cases
// are ready then, so each round picks one at random; every round's message
// must be nakked exactly once.
func TestLateSendIsNakked(t *testing.T) {
	st := testenv.NewNATSStream(t, testenv.NATS(t), "LATE")
	ctx := context.Background()
	cons, err := st.JS.CreateConsumer(ctx, st.Name, jetstream.ConsumerConfig{Durable: "late", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(st.JS, Config{Stream: st.Name, Consumer: "late"})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 64 {
		rc := newReceiver(s, cons, bytebudget.New(1<<20), 8, 8)
		rc.end(nil) // no subscription open: end only stops and takes what waits
		m := &nakCounter{}
		rc.send(received{msg: m, cost: 1})
		if n := m.naks.Load(); n != 1 || len(rc.in) != 0 {
			t.Fatalf("round %d: message nakked %d times, %d left in the queue; want 1 and 0", round, n, len(rc.in))
		}
	}
}
