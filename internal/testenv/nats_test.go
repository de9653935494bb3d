package testenv_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// NATSConnect's connection serves JetStream and is closed at the end of
// the test; CreateStream's stream is in memory on the subjects asked for,
// and is gone after the test.
func TestNATSConnectAndCreateStream(t *testing.T) {
	url := testenv.EmbeddedNATS(t)
	var nc *nats.Conn
	name := testenv.UniqueName(t, "S")
	t.Run("inner", func(t *testing.T) {
		var js jetstream.JetStream
		nc, js = testenv.NATSConnect(t, url, nats.Name("testenv-test"))
		if got := nc.Opts.Timeout; got != 2*time.Second {
			t.Errorf("connect timeout %s, want 2s", got)
		}
		if got := nc.Opts.Name; got != "testenv-test" {
			t.Errorf("the caller's option is lost: name %q", got)
		}
		testenv.CreateStream(t, js, name, "a.>", "b")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("the stream CreateStream made: %v", err)
		}
		cfg := s.CachedInfo().Config
		if cfg.Storage != jetstream.MemoryStorage || !slices.Equal(cfg.Subjects, []string{"a.>", "b"}) {
			t.Fatalf("stream config storage %v subjects %v, want memory on a.> and b", cfg.Storage, cfg.Subjects)
		}
	})
	if !nc.IsClosed() {
		t.Fatal("the connection is still open after the test")
	}
	_, js := testenv.NATSConnect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("the stream after the test: %v, want it deleted", err)
	}
	if msg := failure(t, func(tb testing.TB) { testenv.CreateStream(tb, js, "bad.name", "c") }); msg == "" {
		t.Fatal("CreateStream of an invalid name did not fail the test")
	}
}

// EachNATSServer runs a parallel subtest per server of NATSServers, each
// with a URL that answers; NewNATSStream's stream takes its subject's
// messages.
func TestEachNATSServerAndNewNATSStream(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	t.Run("each", func(t *testing.T) {
		testenv.EachNATSServer(t, func(t *testing.T, url string) {
			mu.Lock()
			seen[t.Name()] = true
			mu.Unlock()
			s := testenv.NewNATSStream(t, url, "E")
			if !strings.HasPrefix(s.Name, "E_") || s.Subject != strings.ToLower(s.Name) {
				t.Fatalf("stream %q subject %q", s.Name, s.Subject)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ack, err := s.JS.Publish(ctx, s.Subject+".x", []byte("m"))
			if err != nil || ack.Stream != s.Name {
				t.Fatalf("publish on %s.x: %+v, %v; want the stream %s to take it", s.Subject, ack, err, s.Name)
			}
		})
	})
	// A server that cannot be found skips its subtest (testenv.NATS).
	found := map[string]bool{}
	for _, srv := range testenv.NATSServers() {
		t.Run("find-"+srv.Name, func(t *testing.T) {
			srv.URL(t)
			found[srv.Name] = true
		})
	}
	for _, srv := range testenv.NATSServers() {
		if n := "TestEachNATSServerAndNewNATSStream/each/" + srv.Name; found[srv.Name] != seen[n] {
			t.Errorf("server %s found %v, subtest %s ran %v (ran: %v)", srv.Name, found[srv.Name], n, seen[n], seen)
		}
	}
	if len(seen) == 0 {
		t.Fatal("no subtest ran")
	}
}
