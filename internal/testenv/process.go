package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Process is a program a test runs in the background (a built binary
// under test), with its stdout and stderr written to one buffer that the
// test reads while it runs.
type Process struct {
	// Cmd is the started command.
	Cmd *exec.Cmd
	// Output holds what the process wrote to stdout and stderr so far.
	Output *SyncBuffer
	done   chan struct{}
	err    error // set before done is closed
}

// StartProcess starts path with args, in the test's environment plus env
// ("NAME=value" entries, which win over the inherited ones). When the test
// ends the process is killed and waited for, and, if the test failed, its
// output is logged.
func StartProcess(t testing.TB, env []string, path string, args ...string) *Process {
	t.Helper()
	p := &Process{Cmd: exec.Command(path, args...), Output: &SyncBuffer{}, done: make(chan struct{})}
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stdout, p.Cmd.Stderr = p.Output, p.Output
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("testenv: starting %s: %v", path, err)
	}
	go func() {
		defer close(p.done)
		p.err = p.Cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.Cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s %v output:\n%s", filepath.Base(path), args, p.Output.String())
		}
	})
	return p
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is what waiting for the process returned (an *exec.ExitError for a
// non-zero exit); it is only meaningful once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Kill kills the process with SIGKILL, as a crash would, and waits until
// it has exited.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends sig to the process and returns its exit code (see ExitCode),
// failing t if it has not exited within the given time.
func (p *Process) Stop(t testing.TB, sig os.Signal, within time.Duration) int {
	t.Helper()
	_ = p.Cmd.Process.Signal(sig)
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		t.Fatalf("testenv: %s did not exit within %s of %v", filepath.Base(p.Cmd.Path), within, sig)
	}
	return ExitCode(p.err)
}

// ExitCode is the exit code that err, as exec.Cmd's Run or Wait returns
// it, stands for: 0 for nil, the status of an *exec.ExitError (-1 when a
// signal ended the process), and -1 for any other error.
func ExitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
