package testenv

import (
	"context"
	"testing"
	"time"
)

// cleanupWait is how long the end of a test waits for a Running to return.
const cleanupWait = time.Minute

// Running is a blocking call (a Worker's Run, a Source's Consume) that Go
// runs in the background for a test, which stops it and reads its result.
type Running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
}

// Go runs run(ctx) on a goroutine of its own. Stop cancels ctx; so does
// the end of the test, which then waits up to a minute for run to return
// and fails the test if it does not.
func Go(t testing.TB, run func(ctx context.Context) error) *Running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(cleanupWait):
			t.Errorf("testenv: the call Go started did not return within %s of the end of the test", cleanupWait)
		}
	})
	return r
}

// Cancel cancels run's context and returns at once.
func (r *Running) Cancel() { r.cancel() }

// Done is closed when run has returned.
func (r *Running) Done() <-chan struct{} { return r.done }

// Stop cancels run's context and returns what run returned, failing t if
// it does not return within timeout.
func (r *Running) Stop(t testing.TB, timeout time.Duration) error {
	t.Helper()
	r.cancel()
	return r.Wait(t, timeout)
}

// Wait returns what run returned, failing t if it does not return within
// timeout; it does not cancel.
func (r *Running) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-r.done:
		return r.err
	case <-timer.C:
		t.Fatalf("testenv: the call Go started did not return within %s", timeout)
		return nil
	}
}
