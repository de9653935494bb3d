package deploytest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// RepoRoot returns the module root: the nearest parent of the working
// directory (a test's package directory) that holds go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		dir = parent
	}
}

// BuildBinary builds ./cmd/dedupworker into dir and returns its path. For
// TestMain: build once, run many.
func BuildBinary(dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "dedupworker")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/dedupworker")
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/dedupworker: %v\n%s", err, out.String())
	}
	return bin, nil
}

// Eventually polls cond every 20ms until it holds, and fails the test with
// what (and cond's last complaint) when within passes first.
func Eventually(t testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s (last: %s)", within, what, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
