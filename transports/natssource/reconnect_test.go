package natssource_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"context"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// TestReconnect: the server restarts under a running worker (same port,
// same store); the connection reconnects, the Source waits for it and goes
// on, and every message is handled once.
func TestReconnect(t *testing.T) {
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true}
	start := func(o *server.Options) *server.Server {
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats-server not ready")
		}
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		return s
	}
	s1 := start(opts)
	port := s1.Addr().(*net.TCPAddr).Port
	nc, err := nats.Connect(s1.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	e := &env{nc: nc, js: js, stream: "RECONNECT", subj: "reconnect"}
	ctx := ctxT(t, 10*time.Second)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{"reconnect.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	s := newSeen()
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		s.add(string(m.Payload), 0)
		return nil, nil
	})
	run(t, dispatch.Config{}, newSource(t, e, natssource.Config{}), h, dispatch.WithConcurrency(4))
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctxT(t, 10*time.Second), "reconnect.x", fmt.Appendf(nil, "m%d", i)); err != nil {
				t.Fatalf("publish m%d: %v", i, err)
			}
		}
	}
	publish(0, 5)
	e.drained(t, "c", 10*time.Second)

	s1.Shutdown()
	s1.WaitForShutdown()
	testenv.Eventually(t, 5*time.Second, "the connection lost", func() bool { return !nc.IsConnected() })
	o2 := opts.Clone()
	o2.Port = port
	start(o2)
	testenv.Eventually(t, 10*time.Second, "a reconnect", nc.IsConnected)
	publish(5, 10)
	// nats-server's NumPending is a running count its consumer raises as
	// the stream signals new messages, so consumer info just after a publish
	// can still say 0 pending and "drained" alone can pass before the new
	// messages are delivered: wait for every message to be handled first,
	// then for the acks.
	testenv.Eventually(t, 20*time.Second, "every message handled", func() bool {
		for i := range 10 {
			if len(s.get(fmt.Sprintf("m%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	e.drained(t, "c", 20*time.Second)
	for i := range 10 {
		if n := len(s.get(fmt.Sprintf("m%d", i))); n != 1 {
			t.Errorf("m%d handled %d times", i, n)
		}
	}
}

// TestClosedConnection: a connection closed for good ends Run with an error.
func TestClosedConnection(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		nc, err := nats.Connect(e.url)
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		own := *e
		own.js = js
		idle := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })
		r := run(t, dispatch.Config{}, newSource(t, &own, natssource.Config{}), idle)
		e.drained(t, "c", 10*time.Second) // bound and idle
		nc.Close()
		err = r.Wait(t, 10*time.Second)
		if err == nil || !strings.Contains(err.Error(), "connection closed") || !strings.Contains(err.Error(), e.stream) {
			t.Errorf("Run = %v, want a closed-connection error naming the stream", err)
		}
	})
}
