package actions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// errCodeStoreFailed is the JetStream error code of a message the stream
// did not store, here because it holds MaxMsgs already under DiscardNew
// ("maximum messages exceeded"); jetstream has no name for it.
const errCodeStoreFailed jetstream.ErrorCode = 10077

// natsRun runs ForwardNATS through js on n messages whose payloads are
// "m0", "m1", ... in a goroutine, and returns their results on the channel
// once the run returns.
func natsRun(ctx context.Context, js NATSPublisher, subject string, n int) <-chan []consumer.Result {
	ms := make([]*consumer.Message, n)
	for i := range ms {
		ms[i] = &consumer.Message{Payload: fmt.Appendf(nil, "m%d", i)}
	}
	fwd := ForwardNATS("relay", js, subject, nil)
	out := make(chan []consumer.Result, 1)
	go func() {
		results := make([]consumer.Result, n)
		fwd(ctx, ms, results)
		out <- results
	}()
	return out
}

// registered is how many messages of js's runs wait for an answer.
func registered(js *NATSJetStream) int {
	js.mu.Lock()
	defer js.mu.Unlock()
	return len(js.pending)
}

// natsJetStream connects to url and makes a NATSJetStream on the
// connection, which is closed when the test ends.
func natsJetStream(t testing.TB, url string, opts ...nats.Option) *NATSJetStream {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(2 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := NewNATSJetStream(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// A run the stream refuses in part (MaxMsgs with DiscardNew) reports the
// stored messages with their own sequences and exactly the refused ones as
// failed; a run to a subject no stream captures fails every message.
func TestForwardNATSPartlyRefusedRun(t *testing.T) {
	for _, srv := range testenv.NATSServers() {
		t.Run(srv.Name, func(t *testing.T) {
			js := natsJetStream(t, srv.URL(t))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			name := "ACTFULL" + strings.ToUpper(randomSuffix(t))
			subject := "actfull." + name
			stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
				Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage,
				MaxMsgs: 3, Discard: jetstream.DiscardNew,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })

			results := <-natsRun(ctx, js, subject, 5)
			for i, r := range results[:3] {
				if want := fmt.Sprintf("%s:%d", name, i+1); r.Err != nil || string(r.Value) != want {
					t.Errorf("message %d: %q %v, want %s", i, r.Value, r.Err, want)
					continue
				}
				raw, err := stream.GetMsg(ctx, uint64(i+1))
				if err != nil {
					t.Fatalf("stream message %d: %v", i+1, err)
				}
				if want := fmt.Sprintf("m%d", i); string(raw.Data) != want {
					t.Errorf("message %d's result names sequence %d, which holds %q, not %q", i, i+1, raw.Data, want)
				}
			}
			for i, r := range results[3:] {
				var apiErr *jetstream.APIError
				if !errors.As(r.Err, &apiErr) || apiErr.ErrorCode != errCodeStoreFailed {
					t.Errorf("message %d: %q %v, want the stream's maximum messages exceeded", i+3, r.Value, r.Err)
				}
			}

			for i, r := range <-natsRun(ctx, js, "actnostream."+name, 3) {
				if !errors.Is(r.Err, jetstream.ErrNoStreamResponse) {
					t.Errorf("message %d to a subject without a stream: %q %v, want %v", i, r.Value, r.Err, jetstream.ErrNoStreamResponse)
				}
			}
		})
	}
}

// answerer plays a stream on a core subject of a real server: it hands the
// test every message published to the subject, and the test answers each
// with a PubAck or an error of its choice, when it chooses.
type answerer struct {
	t   *testing.T
	nc  *nats.Conn
	got chan *nats.Msg
}

func newAnswerer(t *testing.T, url, subject string) *answerer {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	a := &answerer{t: t, nc: nc, got: make(chan *nats.Msg, 64)}
	if _, err := nc.ChanSubscribe(subject, a.got); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a
}

// take returns the next n published messages, in publish order.
func (a *answerer) take(n int) []*nats.Msg {
	a.t.Helper()
	ms := make([]*nats.Msg, n)
	for i := range ms {
		select {
		case ms[i] = <-a.got:
		case <-time.After(10 * time.Second):
			a.t.Fatalf("%d of %d messages published within 10s", i, n)
		}
	}
	return ms
}

func (a *answerer) ack(m *nats.Msg, seq uint64) {
	a.t.Helper()
	if err := m.Respond(fmt.Appendf(nil, `{"stream":"FAKE","seq":%d}`, seq)); err != nil {
		a.t.Fatal(err)
	}
}

func (a *answerer) refuse(m *nats.Msg) {
	a.t.Helper()
	if err := m.Respond([]byte(`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`)); err != nil {
		a.t.Fatal(err)
	}
}

// Each message of a run is reported with its own PubAck, answered in any
// order, and the run is not reported before the last PubAck is in.
func TestForwardNATSReportsEachMessageAfterItsPubAck(t *testing.T) {
	url := testenv.NATS(t)
	subject := "actfake." + randomSuffix(t)
	a := newAnswerer(t, url, subject)
	js := natsJetStream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 6
	run := natsRun(ctx, js, subject, n)
	ms := a.take(n)
	// Answered last first; message 2 is refused; message 0 waits.
	for i := n - 1; i > 0; i-- {
		if i == 2 {
			a.refuse(ms[i])
		} else {
			a.ack(ms[i], uint64(100+i))
		}
	}
	// Every other answer is in when one message is still registered.
	testenv.Eventually(t, 10*time.Second, "every answer but message 0's is in", func() bool { return registered(js) == 1 })
	select {
	case results := <-run:
		t.Fatalf("the run was reported before message 0's PubAck: %v", results)
	default:
	}
	a.ack(ms[0], 100)
	results := <-run
	for i, r := range results {
		if string(ms[i].Data) != fmt.Sprintf("m%d", i) {
			t.Fatalf("publish %d carries %q", i, ms[i].Data)
		}
		if i == 2 {
			var apiErr *jetstream.APIError
			if !errors.As(r.Err, &apiErr) || apiErr.ErrorCode != errCodeStoreFailed {
				t.Errorf("message 2: %q %v, want its refusal", r.Value, r.Err)
			}
			continue
		}
		if want := fmt.Sprintf("FAKE:%d", 100+i); r.Err != nil || string(r.Value) != want {
			t.Errorf("message %d: %q %v, want %s", i, r.Value, r.Err, want)
		}
	}
}

// A connection lost while a run waits fails exactly the messages whose
// PubAck had not come, with nats.ErrDisconnected, without waiting for the
// run's deadline.
func TestForwardNATSConnectionLossFailsTheUnacked(t *testing.T) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready after 10s")
	}
	subject := "actlost." + randomSuffix(t)
	a := newAnswerer(t, s.ClientURL(), subject)
	js := natsJetStream(t, s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 4
	run := natsRun(ctx, js, subject, n)
	ms := a.take(n)
	a.ack(ms[1], 11)
	a.ack(ms[3], 13)
	testenv.Eventually(t, 10*time.Second, "the two answers are in", func() bool { return registered(js) == 2 })
	start := time.Now()
	s.Shutdown()
	var results []consumer.Result
	select {
	case results = <-run:
	case <-time.After(10 * time.Second):
		t.Fatal("the run still waits 10s after its connection was lost")
	}
	for i, r := range results {
		switch i {
		case 1, 3:
			if want := fmt.Sprintf("FAKE:%d", 10+i); r.Err != nil || string(r.Value) != want {
				t.Errorf("message %d: %q %v, want %s", i, r.Value, r.Err, want)
			}
		default:
			if !errors.Is(r.Err, nats.ErrDisconnected) {
				t.Errorf("message %d: %q %v, want %v", i, r.Value, r.Err, nats.ErrDisconnected)
			}
		}
	}
	t.Logf("the run ended %v after the server's shutdown", time.Since(start))
}

// TestForwardNATSWaitsForEveryPubAck checks that each message of a run gets
// its own answer: a PubAck, an error, a publish that failed at once (a
// payload over the server's maximum), or none before the context's
// deadline; that an answer after the run returned is not written into its
// results; and that the run leaves none of its messages registered.
func TestForwardNATSWaitsForEveryPubAck(t *testing.T) {
	url := testenv.NATS(t)
	subject := "actwait." + randomSuffix(t)
	a := newAnswerer(t, url, subject)
	js := natsJetStream(t, url)
	ms := make([]*consumer.Message, 5)
	for i := range ms {
		ms[i] = &consumer.Message{Payload: fmt.Appendf(nil, "m%d", i)}
	}
	ms[4].Payload = make([]byte, 2<<20)
	fwd := ForwardNATS("relay", js, subject, nil)
	results := make([]consumer.Result, len(ms))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fwd(ctx, ms, results)
	}()
	sent := a.take(4)
	// The answers, in an order other than the publishes': message 3 gets
	// one only after the run.
	a.refuse(sent[1])
	a.ack(sent[0], 7)
	a.ack(sent[2], 8)
	<-done
	a.ack(sent[3], 9)
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if string(results[0].Value) != "FAKE:7" || results[0].Err != nil {
		t.Errorf("message 0: %q %v, want FAKE:7", results[0].Value, results[0].Err)
	}
	var apiErr *jetstream.APIError
	if !errors.As(results[1].Err, &apiErr) || apiErr.ErrorCode != errCodeStoreFailed {
		t.Errorf("message 1: %q %v, want its refusal", results[1].Value, results[1].Err)
	}
	if string(results[2].Value) != "FAKE:8" || results[2].Err != nil {
		t.Errorf("message 2: %q %v, want FAKE:8", results[2].Value, results[2].Err)
	}
	if results[3].Err == nil || !strings.Contains(results[3].Err.Error(), "no PubAck") || results[3].Value != nil {
		t.Errorf("message 3: %q %v, want no PubAck by the deadline", results[3].Value, results[3].Err)
	}
	if !errors.Is(results[4].Err, nats.ErrMaxPayload) {
		t.Errorf("message 4: %v, want its publish's own error", results[4].Err)
	}
	for i, m := range sent {
		if got := m.Header.Get(nats.MsgIdHdr); got != "" {
			t.Errorf("message %d: Nats-Msg-Id %q without a claim", i, got)
		}
		if want := fmt.Sprintf("m%d", i); string(m.Data) != want {
			t.Errorf("message %d published as %q, want %q", i, m.Data, want)
		}
	}
	// Message 3's late PubAck, in after the run, found it unregistered.
	if n := registered(js); n != 0 {
		t.Errorf("%d messages still registered after the run", n)
	}
	if string(results[3].Value) != "" {
		t.Errorf("message 3's late PubAck was written into the run's results: %q", results[3].Value)
	}
}

// fastPubAck reads what nats-server writes for a stored message exactly as
// encoding/json does, and leaves every other form to it.
func TestFastPubAck(t *testing.T) {
	for _, tc := range []struct {
		in   string
		fast bool
	}{
		{`{"stream":"ORDERS","seq":1}`, true},
		{`{"stream":"ORDERS","seq":18446744073709551615}`, true},
		{`{"stream":"ORDERS","domain":"hub","seq":42}`, true},
		{`{"stream":"ORDERS","seq":7,"duplicate": true}`, true},
		{`{"stream":"ORDERS","domain":"hub","seq":7,"duplicate":true}`, true},
		{`{"stream":"OR\"DERS","seq":1}`, false},
		{`{"stream":"ORDERS","seq":18446744073709551616}`, false},
		{`{"stream":"ORDERS","seq":}`, false},
		{`{"stream":"","seq":3}`, false},
		{`{"stream":"ORDERS","seq":3,"val":"4"}`, false},
		{`{"stream":"ORDERS","seq":3,"duplicate": true,"batch":"b","count":2}`, false},
		{`{"stream":"ORDERS", "seq":3}`, true},
		{`{"stream":"ORDERS", "seq":3,"duplicate": true}`, true},
		{` { "stream" : "ORDERS" ,"seq": 3 } `, true},
		{`{"seq":3,"stream":"ORDERS"}`, true},
		{`{"stream":"ORDERS","seq":3,"duplicate":false}`, true},
		{`{"stream":"ORDERS"}`, false},
		{`{"seq":3}`, false},
		{`{}`, false},
		{`{"stream":"ORDERS","seq":3,}`, false},
		{`{"stream":"ORDERS","seq":3}x`, false},
		{`{"stream":"ORDERS","seq":03}`, false},
		{`{"stream":"ORDERS","seq":-3}`, false},
		{`{"stream":"ORDERS","seq":3.5}`, false},
		{`{"stream":"ORDERS","seq":3e2}`, false},
		{`{"stream":"ORDERS","seq":"3"}`, false},
		{`{"stream":"ORDERS","seq":3,"duplicate":1}`, false},
		{`{"stream":"ORDERS","domain":"h\u0075b","seq":3}`, false},
		{`{"stream":"ORDERS","seq":3`, false},
		{`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`, false},
		{``, false},
	} {
		stream, seq, ok := fastPubAck([]byte(tc.in))
		if ok != tc.fast {
			t.Errorf("%s: fast %v, want %v", tc.in, ok, tc.fast)
			continue
		}
		if !ok {
			continue
		}
		var want jetstream.PubAck
		if err := json.Unmarshal([]byte(tc.in), &want); err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if string(stream) != want.Stream || seq != want.Sequence {
			t.Errorf("%s: %q %d, encoding/json reads %q %d", tc.in, stream, seq, want.Stream, want.Sequence)
		}
	}
	// What the fast path leaves decodes as jetstream decodes it.
	if ans := decodePubAck([]byte(`{"stream":"ORDERS","seq":3,"val":"4"}`)); ans.err != nil || ans.stream != "ORDERS" || ans.seq != 3 {
		t.Errorf("a counter's PubAck decoded as %+v", ans)
	}
	var apiErr *jetstream.APIError
	if ans := decodePubAck([]byte(`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`)); !errors.As(ans.err, &apiErr) || apiErr.ErrorCode != errCodeStoreFailed {
		t.Errorf("an error PubAck decoded as %+v", ans)
	}
	for _, in := range []string{`not json`, `{}`, `{"stream":"","seq":3}`} {
		if ans := decodePubAck([]byte(in)); !errors.Is(ans.err, jetstream.ErrInvalidJSAck) {
			t.Errorf("%s decoded as %+v, want %v", in, ans, jetstream.ErrInvalidJSAck)
		}
	}
}

// A message that finds no responder (a stream being created, or whose
// leader is being elected) is published again, as jetstream does, and
// gets the PubAck of the responder that is there by then.
func TestForwardNATSRetriesNoResponders(t *testing.T) {
	url := testenv.NATS(t)
	subject := "actretry." + randomSuffix(t)
	js := natsJetStream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 3
	run := natsRun(ctx, js, subject, n)
	testenv.Eventually(t, 10*time.Second, "every message answered by no responders once", func() bool {
		js.mu.Lock()
		defer js.mu.Unlock()
		retried := 0
		for _, s := range js.pending {
			if s.retries > 0 {
				retried++
			}
		}
		return retried == n
	})
	a := newAnswerer(t, url, subject)
	// Each message's own timer publishes it again: in any order.
	for _, m := range a.take(n) {
		var i uint64
		if _, err := fmt.Sscanf(string(m.Data), "m%d", &i); err != nil {
			t.Fatalf("republished %q: %v", m.Data, err)
		}
		a.ack(m, 20+i)
	}
	for i, r := range <-run {
		if want := fmt.Sprintf("FAKE:%d", 20+i); r.Err != nil || string(r.Value) != want {
			t.Errorf("message %d: %q %v, want %s", i, r.Value, r.Err, want)
		}
	}
}
