package testenv_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// A Process sees the extra environment, writes stdout and stderr into
// Output, and Stop returns the exit code of its signal handler; Kill ends
// it with -1; one that ignores the signal fails Stop.
func TestProcess(t *testing.T) {
	p := testenv.StartProcess(t, []string{"TESTENV_X=from-env"}, "sh", "-c",
		`trap 'echo bye >&2; exit 3' TERM; echo "ready $TESTENV_X"; while :; do sleep 0.05; done`)
	testenv.Eventually(t, 10*time.Second, "the ready line", func() bool { return strings.Contains(p.Output.String(), "ready from-env") })
	if code := p.Stop(t, syscall.SIGTERM, 10*time.Second); code != 3 || !strings.Contains(p.Output.String(), "bye") {
		t.Fatalf("Stop = %d with output %q, want exit 3 and the handler's stderr", code, p.Output.String())
	}
	if testenv.ExitCode(p.Err()) != 3 {
		t.Fatalf("Err = %v, want exit status 3", p.Err())
	}

	k := testenv.StartProcess(t, nil, "sh", "-c", `echo up; while :; do sleep 0.05; done`)
	testenv.Eventually(t, 10*time.Second, "the up line", func() bool { return strings.Contains(k.Output.String(), "up") })
	k.Kill()
	select {
	case <-k.Done():
	default:
		t.Fatal("Done is open after Kill returned")
	}
	if code := testenv.ExitCode(k.Err()); code != -1 {
		t.Fatalf("exit code after SIGKILL %d, want -1", code)
	}

	stubborn := testenv.StartProcess(t, nil, "sh", "-c", `trap '' TERM; echo ignoring; while :; do sleep 0.05; done`)
	testenv.Eventually(t, 10*time.Second, "the ignoring line", func() bool { return strings.Contains(stubborn.Output.String(), "ignoring") })
	if msg := failure(t, func(tb testing.TB) { stubborn.Stop(tb, syscall.SIGTERM, 200*time.Millisecond) }); !strings.Contains(msg, "did not exit within 200ms") {
		t.Fatalf("Stop of a process that ignores the signal: failure %q", msg)
	}
	if testenv.ExitCode(nil) != 0 {
		t.Fatal("ExitCode(nil) != 0")
	}
}
