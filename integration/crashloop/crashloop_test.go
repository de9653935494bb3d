// Package crashloop_test runs the dedupworker binary on a key whose handler
// kills its worker (kill -9) on every run, restarting the worker each time
// it dies, later than lease + grace, as Kubernetes does under
// CrashLoopBackOff. The key's attempts survive the restarts and
// it is dead-lettered after max_attempts runs, not run for ever.
package crashloop_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
)

const (
	lease       = time.Second
	grace       = 500 * time.Millisecond
	maxAttempts = 3
	// down is how long a dead worker stays down before it is started
	// again: longer than lease + grace, so that without §11.3 the claim's
	// record would be gone by then. It is the fault's duration (a
	// back-off), not a wait for an event.
	down = lease + grace + 1500*time.Millisecond
)

func TestKeyThatKillsItsWorkerIsDeadLetteredAfterMaxAttempts(t *testing.T) {
	bin := buildBinary(t)
	natsURL := testenv.NATS(t)
	redisURL := testenv.Redis(t)
	id := testenv.RandID()
	dir := t.TempDir()
	ledger := filepath.Join(dir, "ledger")

	nc, js := testenv.NATSConnect(t, natsURL, nats.Timeout(5*time.Second))
	stream := "CRASH_" + id
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"crash." + id}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
	})
	dlq := make(chan *nats.Msg, 10)
	sub, err := nc.ChanSubscribe("dlq."+id, dlq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("crash." + id)
	m.Header.Set("Idempotency-Key", "crasher")
	m.Data = []byte(`{"id":"crasher"}`)
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}

	// The handler notes its run in the ledger, then kills its worker: the
	// shell's parent is the dedupworker process that runs it.
	handler := `echo "$DEDUP_KEY $DEDUP_ATTEMPT" >> '` + ledger + `'; kill -9 $PPID; sleep 10`
	cfgPath := filepath.Join(dir, "config.yaml")
	cfg := fmt.Sprintf(`
redis: {url: %q, namespace: crashloop-%s, grace: %s}
http: {addr: ""}
handlers:
  - name: crasher
    source: {nats: {url: %q, stream: %s, consumer: crasher, ack_wait: %s}}
    lease: %s
    max_attempts: %d
    backoff: {initial: 100ms, max: 200ms}
    action: {exec: {command: ["/bin/sh", "-c", %q], timeout: 30s}}
    dead_letter: {nats: {subject: dlq.%s, core: true}} # the test subscribes on core NATS
`, redisURL, id, grace, natsURL, stream, lease, lease, maxAttempts, handler, id)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	// Each of the first max_attempts workers runs the handler and dies of it.
	for run := 1; run <= maxAttempts; run++ {
		w := startWorker(t, bin, cfgPath, dir, run)
		select {
		case <-w.done:
		case <-time.After(60 * time.Second):
			t.Fatalf("worker %d is still alive after 60s: the handler did not run (ledger %v)", run, readLedger(t, ledger))
		}
		if got := readLedger(t, ledger); len(got) != run || got[run-1] != fmt.Sprintf("crasher %d", run) {
			t.Fatalf("after worker %d died the ledger is %q, want run %d as attempt %d", run, got, run, run)
		}
		outlast(down)
	}

	// The next worker finds the key past max_attempts: it dead-letters it
	// without running the handler, and lives.
	w := startWorker(t, bin, cfgPath, dir, maxAttempts+1)
	var dead *nats.Msg
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	select {
	case dead = <-dlq:
	case <-w.done:
		t.Fatalf("worker %d died too: the key ran again (ledger %q) instead of being dead-lettered", maxAttempts+1, readLedger(t, ledger))
	case <-deadline.C:
		t.Fatalf("no dead letter within 60s (ledger %q)", readLedger(t, ledger))
	}
	if r := dead.Header.Get(consumer.HeaderDeadLetterReason); r != "max_attempts" {
		t.Errorf("dead letter reason %q, want max_attempts (headers %v)", r, dead.Header)
	}
	if k := dead.Header.Get(consumer.HeaderDeadLetterKey); k != "crasher" {
		t.Errorf("dead letter key %q, want crasher", k)
	}

	// The record says dead_lettered once the completion is stored (the
	// dead letter is published before it).
	var rec struct {
		State    string `json:"state"`
		Outcome  string `json:"outcome"`
		Attempts int    `json:"attempts"`
	}
	testenv.Eventually(t, 30*time.Second, "inspect reports the key dead_lettered", func() bool {
		out := inspect(t, bin, cfgPath)
		return json.Unmarshal(out, &rec) == nil && rec.Outcome == "dead_lettered"
	})
	if rec.State != "COMPLETED" {
		t.Errorf("record state %s, want COMPLETED", rec.State)
	}
	if got := readLedger(t, ledger); len(got) != maxAttempts {
		t.Errorf("the handler ran %d times (%q), want exactly %d", len(got), got, maxAttempts)
	}
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Errorf("worker %d did not stop within 30s of SIGTERM", maxAttempts+1)
	}
	t.Logf("%d runs, each killed its worker; dead-lettered by worker %d with headers %v; record %+v", maxAttempts, maxAttempts+1, dead.Header, rec)
}

type worker struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startWorker starts `dedupworker run`, its output in dir/worker-N.log
// (shown when the test fails); the worker is killed when the test ends.
func startWorker(t *testing.T, bin, cfg, dir string, n int) *worker {
	t.Helper()
	logPath := filepath.Join(dir, fmt.Sprintf("worker-%d.log", n))
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: exec.Command(bin, "run", "-c", cfg), done: make(chan struct{})}
	w.cmd.Stdout, w.cmd.Stderr = log, log
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = w.cmd.Wait(); _ = log.Close(); close(w.done) }()
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.done
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("worker %d output:\n%s", n, b)
		}
	})
	return w
}

// inspect runs `dedupworker inspect -o json` on the key.
func inspect(t *testing.T, bin, cfg string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "inspect", "-c", cfg, "--handler", "crasher", "-o", "json", "crasher").Output()
	if err != nil {
		t.Logf("inspect: %v", err)
	}
	return out
}

func readLedger(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// outlast lets d pass: the fault's duration, not synchronisation.
func outlast(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	<-t.C
}

// buildBinary builds dedupworker into the test's temp dir.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dedupworker")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../../cmd/dedupworker").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
