package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestHTTPAndExecActionsRunOncePerKey runs one process with two handlers: an
// http action against a real HTTP server and an exec action running a real
// shell script. Good keys run once despite duplicates; "t-" keys fail once
// (transient) and run again; "p-" keys fail permanently and are
// dead-lettered with their headers.
func TestHTTPAndExecActionsRunOncePerKey(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	id := testenv.RandID()
	createStream(t, js, "HIN_"+id, "hin."+id)
	createStream(t, js, "XIN_"+id, "xin."+id)

	var mu sync.Mutex
	calls := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls[key]++
		n := calls[key]
		mu.Unlock()
		switch {
		case r.Header.Get("X-Dedup-Key") != key || r.Header.Get("X-Dedup-Handler") != "hook" || r.Header.Get("X-Dedup-Fence") == "":
			w.WriteHeader(http.StatusBadRequest) // a missing header fails the test through the DLQ count
		case strings.HasPrefix(key, "p-"):
			w.WriteHeader(http.StatusUnprocessableEntity)
		case strings.HasPrefix(key, "t-") && n == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			_, _ = w.Write(append([]byte("ok:"), body...))
		}
	}))
	defer srv.Close()

	dir := t.TempDir()
	script := filepath.Join(dir, "handle.sh")
	if err := os.WriteFile(script, []byte(`#!/bin/sh
case "$DEDUP_KEY" in p-*) echo "bad order $DEDUP_KEY" >&2; exit 65;; esac
case "$DEDUP_KEY" in t-*) if [ ! -e "`+dir+`/$DEDUP_KEY.tried" ]; then touch "`+dir+`/$DEDUP_KEY.tried"; exit 1; fi;; esac
echo "$DEDUP_KEY $DEDUP_FENCE $DEDUP_ATTEMPT $DEDUP_SOURCE" >> "`+dir+`/ledger"
cat
`), 0o755); err != nil {
		t.Fatal(err)
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	dlq := make(chan *nats.Msg, 100)
	sub, err := nc.ChanSubscribe("dlq."+id+".>", dlq)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	cfg := writeConfig(t, `
redis: {url: %q, namespace: act-%s}
http: {addr: ""}
handlers:
  - name: hook
    source: {nats: {url: %q, stream: HIN_%s, consumer: hook}}
    max_attempts: 3
    backoff: {initial: 50ms, max: 100ms}
    action: {http: {url: %q, timeout: 5s}}
    dead_letter: {nats: {subject: dlq.%s.hook, core: true}} # the test subscribes
  - name: script
    source: {nats: {url: %q, stream: XIN_%s, consumer: script}}
    max_attempts: 3
    backoff: {initial: 50ms, max: 100ms}
    action: {exec: {command: [%q], timeout: 10s}}
    dead_letter: {nats: {subject: dlq.%s.script, core: true}}
`, testenv.Redis(t), id, url, id, srv.URL, id, url, id, script, id)

	good := dupPlan("g", 50)
	keys := append(good, "t-1", "t-2", "t-2", "p-1", "p-2", "p-1")
	publishNATS(t, js, "hin."+id, keys)
	publishNATS(t, js, "xin."+id, keys)
	p := start(t, nil, "run", "-c", cfg)

	var dead []*nats.Msg
	testenv.Eventually(t, 30*time.Second, "4 dead letters (p-1, p-2 on each handler)", func() bool {
		for {
			select {
			case m := <-dlq:
				dead = append(dead, m)
				continue
			default:
			}
			return len(dead) >= 4
		}
	})
	ledger := func() []string {
		b, _ := os.ReadFile(filepath.Join(dir, "ledger"))
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	testenv.Eventually(t, 30*time.Second, "every good key ran, and every t- key ran again after its failure", func() bool {
		mu.Lock()
		n, retried := len(calls), calls["t-1"] >= 2 && calls["t-2"] >= 2
		mu.Unlock()
		return n == 50+4 && retried && len(ledger()) == 50+2
	})
	if code := p.term(30 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}

	mu.Lock()
	for k, n := range calls {
		want := 1
		if strings.HasPrefix(k, "t-") {
			want = 2 // 503 once, then 200
		}
		if n != want {
			t.Errorf("http: key %s called %d times, want %d", k, n, want)
		}
	}
	mu.Unlock()
	lines := ledger()
	sort.Strings(lines)
	seen := map[string]bool{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) != 4 || seen[f[0]] {
			t.Fatalf("exec ledger line %q: each key must succeed once, with fence, attempt and source", l)
		}
		seen[f[0]] = true
		if strings.HasPrefix(f[0], "t-") && f[2] != "2" {
			t.Errorf("exec: %s succeeded on attempt %s, want 2", f[0], f[2])
		}
		if f[3] != "xin."+id {
			t.Errorf("exec: DEDUP_SOURCE %q, want the subject", f[3])
		}
	}
	if len(dead) != 4 {
		t.Fatalf("%d dead letters, want 4", len(dead))
	}
	for _, m := range dead {
		if m.Header.Get(consumer.HeaderDeadLetterReason) != "permanent_error" || !strings.HasPrefix(m.Header.Get(consumer.HeaderDeadLetterKey), "p-") ||
			m.Header.Get(consumer.HeaderDeadLetterOffset) == "" || m.Header.Get(consumer.HeaderDeadLetterError) == "" {
			t.Errorf("dead letter on %s with headers %v: want reason permanent_error, a p- key, the sequence and the error", m.Subject, m.Header)
		}
	}
	t.Logf("http: %d keys called; exec: %d ledger lines; %d dead letters", len(calls), len(lines), len(dead))
}
