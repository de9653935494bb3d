package actions

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

func msg() *consumer.Message {
	return &consumer.Message{
		Key:     []byte("customer-1"),
		Payload: []byte(`{"id":7}`),
		Header:  consumer.Header{"Idempotency-Key": {"stale"}, "Traceparent": {"00-abc"}},
		Origin:  consumer.Origin{Transport: "nats", Topic: "ORDERS", Subject: "orders.eu", Offset: 3},
	}
}

func TestHTTPStatusClasses(t *testing.T) {
	var got *http.Request
	var gotBody string
	status, body, retryAfter := 200, "stored-result", ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got, gotBody = r, string(b)
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	h := HTTP(HTTPConfig{Handler: "orders", URL: srv.URL, Timeout: 5 * time.Second, MaxResultBytes: 8})

	res, err := h.Handle(context.Background(), msg())
	if err != nil || string(res) != "stored-r" {
		t.Fatalf("2xx: result %q err %v; want the body capped at 8 bytes", res, err)
	}
	if gotBody != `{"id":7}` || got.Header.Get("Traceparent") != "00-abc" || got.Header.Get("X-Dedup-Handler") != "orders" || got.Header.Get("X-Dedup-Attempt") != "1" {
		t.Fatalf("request: body %q headers %v", gotBody, got.Header)
	}
	for _, c := range []struct {
		status    int
		permanent bool
	}{{404, true}, {400, true}, {408, false}, {429, false}, {500, false}, {503, false}} {
		status = c.status
		_, err := h.Handle(context.Background(), msg())
		if err == nil || dispatch.IsPermanent(err) != c.permanent {
			t.Errorf("status %d: err %v, want permanent=%v", c.status, err, c.permanent)
		}
	}
	status, retryAfter = 429, "7"
	_, err = h.Handle(context.Background(), msg())
	if d, ok := dispatch.RetryDelay(err); !ok || d != 7*time.Second {
		t.Fatalf("429 with Retry-After: 7 must retry after 7s, got %v", err)
	}
}

// TestHTTPReusesConnections: with the handler's concurrency of requests in
// flight, round after round, the action's client dials at most that many
// connections: each request reuses an idle one instead of dialing its own
// (net/http keeps two a host unless told more).
func TestHTTPReusesConnections(t *testing.T) {
	const conc, rounds = 8, 5
	var (
		mu      sync.Mutex
		dialed  int
		release chan struct{}
	)
	arrived := make(chan struct{}, conc)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		rel := release
		mu.Unlock()
		arrived <- struct{}{}
		<-rel
		_, _ = w.Write([]byte("ok"))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			dialed++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	h := HTTP(HTTPConfig{Handler: "orders", URL: srv.URL, Timeout: 10 * time.Second, Concurrency: conc})

	for range rounds {
		mu.Lock()
		release = make(chan struct{})
		mu.Unlock()
		errs := make(chan error, conc)
		for range conc {
			go func() {
				_, err := h.Handle(context.Background(), msg())
				errs <- err
			}()
		}
		// Every request of the round in flight at once, so none can reuse
		// another's connection within the round.
		timeout := time.After(10 * time.Second)
		for i := range conc {
			select {
			case <-arrived:
			case <-timeout:
				t.Fatalf("%d of %d requests reached the server", i, conc)
			}
		}
		mu.Lock()
		close(release)
		mu.Unlock()
		for range conc {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if dialed > conc {
		t.Errorf("%d connections dialed for %d rounds of %d requests in flight: want at most %d, each request reusing an idle one", dialed, rounds, conc, conc)
	}
}

func TestHTTPTimeoutIsTransient(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	h := HTTP(HTTPConfig{URL: srv.URL, Timeout: 100 * time.Millisecond, MaxResultBytes: 10})
	_, err := h.Handle(context.Background(), msg())
	if err == nil || dispatch.IsPermanent(err) {
		t.Fatalf("a timeout must be a transient error, got %v", err)
	}
}

func TestExecExitCodesAndEnvironment(t *testing.T) {
	t.Setenv("EXTRA", "x")
	run := func(script string, timeout time.Duration) ([]byte, error) {
		h := Exec(ExecConfig{Handler: "orders", Command: []string{"sh", "-c", script}, Timeout: timeout, MaxOutputBytes: 64, Env: []string{"EXTRA"}})
		return h.Handle(context.Background(), msg())
	}
	res, err := run(`read p; echo "$p|$DEDUP_HANDLER|$DEDUP_ATTEMPT|$DEDUP_SOURCE|$EXTRA"`, 5*time.Second)
	if err != nil || string(res) != "{\"id\":7}|orders|1|orders.eu|x\n" {
		t.Fatalf("exit 0: result %q err %v", res, err)
	}
	if _, err := run("echo bad >&2; exit 65", 5*time.Second); !dispatch.IsPermanent(err) || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("exit 65 must be permanent and carry stderr, got %v", err)
	}
	if _, err := run("exit 3", 5*time.Second); err == nil || dispatch.IsPermanent(err) {
		t.Fatalf("exit 3 must be transient, got %v", err)
	}
	start := time.Now()
	if _, err := run("sleep 30 & wait", 200*time.Millisecond); err == nil || dispatch.IsPermanent(err) {
		t.Fatalf("a timeout must be transient, got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("the process group was not killed on timeout (took %s)", time.Since(start))
	}
	res, _ = run("head -c 1000 /dev/zero", 5*time.Second)
	if len(res) != 64 {
		t.Fatalf("stdout must be capped at 64 bytes, got %d", len(res))
	}
}

// TestExecEnvironmentAllowList: the command sees the base variables, the
// DEDUP_* variables and the names in Env, and none of the worker's other
// variables: a secret in the worker's environment stays there.
func TestExecEnvironmentAllowList(t *testing.T) {
	t.Setenv("REDIS_PASSWORD", "hunter2")
	t.Setenv("DEDUPWORKER_SASL_PASSWORD", "s3cret")
	t.Setenv("API_TOKEN", "tok")
	t.Setenv("TZ", "Europe/Paris")
	h := Exec(ExecConfig{Handler: "orders", Command: []string{"env"}, MaxOutputBytes: 1 << 16,
		Env: []string{"API_TOKEN", "NOT_SET_ANYWHERE"}})
	res, err := h.Handle(context.Background(), msg())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(res)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		got[k] = v
	}
	for k, want := range map[string]string{"API_TOKEN": "tok", "TZ": "Europe/Paris", "DEDUP_HANDLER": "orders", "DEDUP_SOURCE": "orders.eu", "PATH": os.Getenv("PATH")} {
		if got[k] != want {
			t.Errorf("%s = %q in the command's environment, want %q", k, got[k], want)
		}
	}
	for _, k := range []string{"REDIS_PASSWORD", "DEDUPWORKER_SASL_PASSWORD", "NOT_SET_ANYWHERE"} {
		if v, ok := got[k]; ok {
			t.Errorf("%s=%q reached the command; only allow-listed variables may", k, v)
		}
	}
	allowed := map[string]bool{"API_TOKEN": true}
	for _, k := range BaseEnv {
		allowed[k] = true
	}
	for k := range got {
		if !allowed[k] && !strings.HasPrefix(k, "DEDUP_") {
			t.Errorf("%s reached the command; it is neither in BaseEnv, Env nor DEDUP_*", k)
		}
	}
}

func TestExecKilledWhenContextEnds(t *testing.T) {
	h := Exec(ExecConfig{Command: []string{"sleep", "30"}, MaxOutputBytes: 10})
	ctx, cancel := context.WithCancelCause(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := h.Handle(ctx, msg()); errc <- err }()
	cause := errors.New("lease lost")
	time.AfterFunc(100*time.Millisecond, func() { cancel(cause) })
	select {
	case err := <-errc:
		if !errors.Is(err, cause) {
			t.Fatalf("err %v, want the context's cause", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the command was not killed when its context ended")
	}
}

type fakeWriter struct{ got []kafka.Message }

func (w *fakeWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.got = append(w.got, msgs...)
	return nil
}

func TestForwardKafkaKeepsMessage(t *testing.T) {
	w := &fakeWriter{}
	if _, err := ForwardKafka("orders", w, nil).Handle(context.Background(), msg()); err != nil {
		t.Fatal(err)
	}
	m := w.got[0]
	if string(m.Key) != "customer-1" || string(m.Value) != `{"id":7}` {
		t.Fatalf("forwarded %+v: key and payload must be unchanged", m)
	}
	var traceparent bool
	for _, h := range m.Headers {
		traceparent = traceparent || (h.Key == "Traceparent" && string(h.Value) == "00-abc")
	}
	if !traceparent {
		t.Fatalf("original headers must be forwarded, got %v", m.Headers)
	}
}

// TestCappedReadFrom: io.Copy into a capped (its ReadFrom) keeps and counts
// exactly what writing the same bytes would, for bodies shorter than, equal
// to and longer than the cap, read whole or a byte at a time.
func TestCappedReadFrom(t *testing.T) {
	for _, n := range []int{0, 1, 8, 600, 5000} {
		for _, size := range []int{0, 1, 7, 8, 9, 512, 599, 600, 601, 5000, 20000} {
			body := make([]byte, size)
			for i := range body {
				body[i] = byte('a' + i%26)
			}
			want := &capped{n: n}
			_, _ = want.Write(body)
			for name, r := range map[string]io.Reader{
				"whole":    bytes.NewReader(body),
				"bytewise": iotest.OneByteReader(bytes.NewReader(body)),
			} {
				got := &capped{n: n}
				k, err := io.Copy(got, r)
				if err != nil || k != int64(size) || !bytes.Equal(got.buf, want.buf) || got.dropped != want.dropped {
					t.Errorf("n %d, %d bytes read %s: copied %d, err %v, kept %d bytes (equal %v), dropped %d; want %d kept, %d dropped",
						n, size, name, k, err, len(got.buf), bytes.Equal(got.buf, want.buf), got.dropped, len(want.buf), want.dropped)
				}
			}
		}
	}
	failing := iotest.TimeoutReader(iotest.OneByteReader(strings.NewReader("abc")))
	if _, err := io.Copy(&capped{n: 8}, failing); err == nil {
		t.Error("a read error must come back from the copy")
	}
}
