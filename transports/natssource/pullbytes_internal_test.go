package natssource

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestPullBytes: a pull request asks for an eighth of the bound, never less
// than the server's max_payload and the subjects' slack (a request that
// cannot take the next message is ended by the server and asked again,
// for ever), and never more than the consumer's MaxRequestMaxBytes.
func TestPullBytes(t *testing.T) {
	st := testenv.NewNATSStream(t, testenv.NATS(t), "PULLBYTES")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	largest := int(st.Conn.MaxPayload())
	if largest <= 0 {
		t.Fatalf("the connection reports max_payload %d", largest)
	}
	plain, err := st.JS.CreateConsumer(ctx, st.Name, jetstream.ConsumerConfig{Durable: "plain", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	capped, err := st.JS.CreateConsumer(ctx, st.Name, jetstream.ConsumerConfig{Durable: "capped", AckPolicy: jetstream.AckExplicitPolicy, MaxRequestMaxBytes: 3 * largest})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		bound int
		cons  jetstream.Consumer
		want  int
	}{
		{"an eighth of a large bound", 64 * largest, plain, 8 * largest},
		{"max_payload under a small bound", 2 * largest, plain, largest + pullSlack},
		{"MaxRequestMaxBytes caps it", 64 * largest, capped, 3 * largest},
	} {
		s, err := New(st.JS, Config{Stream: st.Name, Consumer: "plain", FetchBufferBytes: c.bound})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.pullBytes(c.cons); got != c.want {
			t.Errorf("%s: pull bytes %d with a bound of %d (max_payload %d), want %d", c.name, got, c.bound, largest, c.want)
		}
	}
}
