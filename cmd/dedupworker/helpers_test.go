package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// binPath is the dedupworker binary built once for the package's tests.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dedupworker-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "dedupworker")
	build := exec.Command("go", "build", "-o", binPath, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building dedupworker:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running dedupworker.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr *testenv.SyncBuffer
	done   chan struct{}
	err    error
}

func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(binPath, args...), stderr: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stderr, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("dedupworker %v output:\n%s", args, p.stderr.String())
		}
	})
	return p
}

// kill9 kills the process as a crash would.
func (p *proc) kill9() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// term sends SIGTERM and returns the exit code.
func (p *proc) term(within time.Duration) int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(within):
		p.t.Fatalf("dedupworker did not exit within %s of SIGTERM", within)
	}
	return exitCode(p.err)
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// runCmd runs dedupworker to completion and returns its exit code and output.
func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return exitCode(err), stdout.String(), stderr.String()
}

func writeConfig(t *testing.T, format string, args ...any) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, format, args...), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// dupPlan returns unique keys plus 3 in 10 of them again, shuffled.
func dupPlan(prefix string, unique int) []string {
	keys := make([]string, 0, unique*13/10)
	for i := range unique {
		keys = append(keys, fmt.Sprintf("%s-%d", prefix, i))
	}
	for i := 0; i < unique; i += 10 {
		for j := range 3 {
			keys = append(keys, fmt.Sprintf("%s-%d", prefix, i+j*3))
		}
	}
	for i := len(keys) - 1; i > 0; i-- {
		var b [1]byte
		_, _ = rand.Read(b[:])
		j := int(b[0]) % (i + 1)
		keys[i], keys[j] = keys[j], keys[i]
	}
	return keys
}
