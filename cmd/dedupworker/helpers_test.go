package main

import (
	"bytes"
	"context"
	"crypto/rand"
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

// proc is a running dedupworker; stderr holds its stdout and stderr.
type proc struct {
	*testenv.Process
	t      *testing.T
	stderr *testenv.SyncBuffer
}

func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := testenv.StartProcess(t, env, binPath, args...)
	return &proc{Process: p, t: t, stderr: p.Output}
}

// kill9 kills the process as a crash would.
func (p *proc) kill9() { p.Kill() }

// term sends SIGTERM and returns the exit code.
func (p *proc) term(within time.Duration) int {
	p.t.Helper()
	return p.Stop(p.t, syscall.SIGTERM, within)
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
	return testenv.ExitCode(err), stdout.String(), stderr.String()
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
