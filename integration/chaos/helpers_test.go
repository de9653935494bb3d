package chaos_test

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// buildBinary builds dedupworker into the test's temp dir.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dedupworker")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/dedupworker").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// restartRedis kills rs (kill -9) and starts it again; wipe deletes its
// data first, as the restart of a Redis without persistence loses it.
func restartRedis(rs *testenv.RedisServer, wipe bool) {
	rs.Stop()
	if wipe {
		_ = os.RemoveAll(filepath.Join(rs.Dir(), "appendonlydir"))
	}
	rs.Start()
}

// startNATS starts an embedded nats-server with file-backed JetStream.
func startNATS(t *testing.T, dir string) string {
	t.Helper()
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: dir, NoSigs: true, NoLog: true, MaxPayload: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return s.ClientURL()
}

// workers are the running dedupworker processes.
type workers struct {
	t       *testing.T
	bin     string
	cfg     string
	logDir  string
	mu      sync.Mutex
	live    []*worker
	started int
	leaving sync.WaitGroup // workers stopping gracefully
}

type worker struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

func (ws *workers) start() {
	ws.t.Helper()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.started++
	log, err := os.Create(filepath.Join(ws.logDir, "worker-"+strconv.Itoa(ws.started)+".log"))
	if err != nil {
		ws.t.Fatal(err)
	}
	w := &worker{cmd: exec.Command(ws.bin, "run", "-c", ws.cfg), done: make(chan struct{}), log: log}
	w.cmd.Stdout, w.cmd.Stderr = log, log
	if err := w.cmd.Start(); err != nil {
		ws.t.Fatal(err)
	}
	go func() { w.err = w.cmd.Wait(); _ = log.Close(); close(w.done) }()
	ws.live = append(ws.live, w)
}

// random removes and returns a random live worker.
func (ws *workers) random(r *rand.Rand) *worker {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	i := r.IntN(len(ws.live))
	w := ws.live[i]
	ws.live = append(ws.live[:i], ws.live[i+1:]...)
	return w
}

func (w *worker) pid() int { return w.cmd.Process.Pid }

func (w *worker) kill() {
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.done
}

// term stops the worker gracefully; after its shutdown timeout and a margin
// it is killed.
func (w *worker) term() {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(15 * time.Second):
		w.kill()
	}
}

func (ws *workers) stopAll() {
	ws.mu.Lock()
	live := ws.live
	ws.live = nil
	ws.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range live {
		wg.Go(w.term)
	}
	wg.Wait()
	ws.leaving.Wait()
}
