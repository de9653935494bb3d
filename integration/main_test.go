package integration_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// hostileBin is the dedupworker binary TestMain builds once for this
// package's tests, in a directory it removes when they end.
var hostileBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dedupworker-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	hostileBin = filepath.Join(dir, "dedupworker")
	code := 1
	if out, err := exec.Command("go", "build", "-o", hostileBin, "../cmd/dedupworker").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}
