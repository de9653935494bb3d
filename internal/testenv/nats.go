package testenv

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultNATSURL is where NATS looks for a server when NATS_URL is unset.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// NATS returns the URL of a running nats-server with JetStream enabled,
// found once per test binary: $NATS_URL; else nats://127.0.0.1:4222 when it
// answers; else a NATS container when a Docker engine answers (see the
// package documentation). Without one the test is skipped, or failed under
// DEDUP_REQUIRE_SERVICES=1 (see Unavailable).
func NATS(t testing.TB) string {
	t.Helper()
	url, why := findNATS()
	if why != "" {
		requireContainer(t, "nats", why)
		Unavailable(t, "nats", why)
	}
	return url
}

var (
	natsOnce sync.Once
	natsURL  string
	natsWhy  string
)

func findNATS() (url, why string) {
	natsOnce.Do(func() {
		if containersOnly() {
			natsURL, natsWhy = fromContainer("nats", "NATS_URL", "", startNATSContainer, sameString, sameString, sameString)
			return
		}
		if env := os.Getenv("NATS_URL"); env != "" {
			natsURL, natsWhy = env, probeNATS(env)
			if natsWhy != "" {
				natsWhy = "NATS_URL is set but " + natsWhy
			}
			return
		}
		natsURL = DefaultNATSURL
		if why := probeNATS(DefaultNATSURL); why != "" {
			natsURL, natsWhy = fromContainer("nats", "NATS_URL", "NATS_URL is not set and "+why+"; start nats-server -js or set NATS_URL",
				startNATSContainer, sameString, sameString, sameString)
		}
	})
	return natsURL, natsWhy
}

// probeNATS returns why url is not a usable JetStream server, or "".
func probeNATS(url string) string {
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.NoReconnect())
	if err != nil {
		return "connecting to " + url + ": " + err.Error()
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return url + " has no JetStream: " + err.Error()
	}
	return ""
}

// EmbeddedNATS starts a current nats-server in-process with JetStream on a
// random loopback port, stores in t.TempDir(), shuts it down when the test
// ends, and returns its URL.
func EmbeddedNATS(t testing.TB) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoSigs:    true,
		NoLog:     true,
	})
	if err != nil {
		t.Fatalf("testenv: embedded nats-server: %v", err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("testenv: embedded nats-server not ready after 10s")
	}
	return s.ClientURL()
}

// NATSServer names a way to get a NATS server for a test.
type NATSServer struct {
	Name string
	URL  func(testing.TB) string
}

// NATSServers lists the servers every NATS test runs against: the system
// one (NATS: the environment's, the local one or a container) and a current one embedded in-process
// (EmbeddedNATS). Use them as subtests:
//
//	for _, srv := range testenv.NATSServers() {
//		t.Run(srv.Name, func(t *testing.T) { url := srv.URL(t); ... })
//	}
func NATSServers() []NATSServer {
	return []NATSServer{{"system", NATS}, {"embedded", EmbeddedNATS}}
}

// NATSConnect connects to url with a 2s connect timeout, then opts (which
// may override it, or set how to reconnect), and makes a JetStream context
// on the connection, which is closed when the test ends.
func NATSConnect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(2 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatalf("testenv: connecting to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testenv: JetStream on %s: %v", url, err)
	}
	return nc, js
}

// natsCall bounds one request of CreateStream or its cleanup.
const natsCall = 5 * time.Second

// CreateStream creates the in-memory stream name on subjects, within 5s,
// and deletes it when the test ends: cleanups run last first, so a
// connection NATSConnect made earlier in the test is still open then. A
// stream the test deleted already, or a connection the test closed, is not
// an error of the cleanup; any other failure to delete is logged.
func CreateStream(t testing.TB, js jetstream.JetStream, name string, subjects ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), natsCall)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatalf("testenv: creating stream %s on %v: %v", name, subjects, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), natsCall)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, nats.ErrConnectionClosed) {
			t.Logf("testenv: deleting stream %s: %v", name, err)
		}
	})
}

// EachNATSServer runs f as a parallel subtest, named after the server,
// against each of NATSServers, with the server's URL.
func EachNATSServer(t *testing.T, f func(t *testing.T, url string)) {
	t.Helper()
	for _, srv := range NATSServers() {
		t.Run(srv.Name, func(t *testing.T) {
			t.Parallel()
			f(t, srv.URL(t))
		})
	}
}

// NATSStream is a test's own connection and in-memory stream.
type NATSStream struct {
	Conn *nats.Conn
	JS   jetstream.JetStream
	// Name is the stream's name, UniqueName(t, prefix).
	Name string
	// Subject is Name in lower case: the stream takes Subject+".>".
	Subject string
}

// NewNATSStream connects to url as NATSConnect does, with opts, and
// creates a stream of the test's own with CreateStream.
func NewNATSStream(t testing.TB, url, prefix string, opts ...nats.Option) *NATSStream {
	t.Helper()
	s := &NATSStream{Name: UniqueName(t, prefix)}
	s.Conn, s.JS = NATSConnect(t, url, opts...)
	s.Subject = strings.ToLower(s.Name)
	CreateStream(t, s.JS, s.Name, s.Subject+".>")
	return s
}
