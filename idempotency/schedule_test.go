package idempotency_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/idempotency/idempotencytest"
)

// runs records when a schedule ran a job, on the schedule's clock.
type runs struct {
	mu sync.Mutex
	at []time.Time
}

func (r *runs) add(t time.Time) {
	r.mu.Lock()
	r.at = append(r.at, t)
	r.mu.Unlock()
}

func (r *runs) get() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.at...)
}

func TestScheduleRunsAtTheDueTimeAndNotBefore(t *testing.T) {
	clock := idempotencytest.NewClock(time.Time{})
	s := idempotency.NewRenewSchedule(clock, 10*time.Millisecond)
	t0 := clock.Now()
	var got runs
	nexts := []time.Duration{500 * time.Millisecond, 500 * time.Millisecond}
	j := s.Add(t0.Add(time.Second), func() (time.Duration, bool) {
		got.add(clock.Now())
		n := len(got.get())
		if n > len(nexts) {
			return 0, false
		}
		return nexts[n-1], true
	})

	step := func(d time.Duration, want ...time.Duration) {
		t.Helper()
		clock.Advance(d)
		s.Idle(j)
		at := got.get()
		if len(at) != len(want) {
			t.Fatalf("at %s: %d runs %v, want %d at %v", clock.Now().Sub(t0), len(at), at, len(want), want)
		}
		for i := range at {
			if at[i].Sub(t0) != want[i] {
				t.Fatalf("run %d at %s, want %s", i, at[i].Sub(t0), want[i])
			}
		}
	}
	step(990 * time.Millisecond)
	step(10*time.Millisecond, time.Second)
	step(490*time.Millisecond, time.Second)
	step(10*time.Millisecond, time.Second, 1500*time.Millisecond)
	if !s.Listed(j) {
		t.Fatal("a job that asked to run again is off the schedule")
	}
	step(500*time.Millisecond, time.Second, 1500*time.Millisecond, 2*time.Second)
	// The job said it was over: it never runs again, and the empty
	// schedule's timer is disarmed at its next scan.
	step(time.Minute, time.Second, 1500*time.Millisecond, 2*time.Second)
	if s.Listed(j) {
		t.Fatal("a job that was over is still on the schedule")
	}
	if n := clock.Timers(); n != 0 {
		t.Fatalf("%d timers armed on an empty schedule, want 0", n)
	}
}

func TestScheduleStoppedEntryNeverRuns(t *testing.T) {
	clock := idempotencytest.NewClock(time.Time{})
	s := idempotency.NewRenewSchedule(clock, 10*time.Millisecond)
	var n atomic.Int32
	j := s.Add(clock.Now().Add(100*time.Millisecond), func() (time.Duration, bool) {
		n.Add(1)
		return time.Millisecond, true
	})
	clock.Advance(50 * time.Millisecond)
	s.Stop(j)
	clock.Advance(time.Hour)
	s.Idle(j)
	if got := n.Load(); got != 0 {
		t.Fatalf("a stopped entry ran %d times, want 0", got)
	}
	if s.Listed(j) {
		t.Fatal("a stopped entry is still on the schedule")
	}
	if got := clock.Timers(); got != 0 {
		t.Fatalf("%d timers armed after the only entry stopped, want 0", got)
	}
}

func TestScheduleStopWaitsForARunningJob(t *testing.T) {
	clock := idempotencytest.NewClock(time.Time{})
	s := idempotency.NewRenewSchedule(clock, 10*time.Millisecond)
	started, release := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	j := s.Add(clock.Now().Add(10*time.Millisecond), func() (time.Duration, bool) {
		if n.Add(1) == 1 {
			close(started)
			<-release
		}
		return 10 * time.Millisecond, true
	})
	clock.Advance(10 * time.Millisecond)
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the due job did not start")
	}
	stopped := make(chan struct{})
	go func() {
		s.Stop(j)
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("Stop returned while the job was running")
	default:
	}
	close(release)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not return after the job finished")
	}
	clock.Advance(time.Second)
	s.Idle(j)
	if got := n.Load(); got != 1 {
		t.Fatalf("the job ran %d times, want 1: it asked to run again but was stopped", got)
	}
}

func TestScheduleEntriesShareOneTimer(t *testing.T) {
	clock := idempotencytest.NewClock(time.Time{})
	s := idempotency.NewRenewSchedule(clock, 10*time.Millisecond)
	t0 := clock.Now()
	const n = 100
	var got runs
	js := make([]*idempotency.RenewEntry, n)
	for i := range js {
		due := t0.Add(time.Duration(i+1) * 10 * time.Millisecond)
		js[i] = s.Add(due, func() (time.Duration, bool) {
			got.add(clock.Now())
			return 0, false
		})
		if timers := clock.Timers(); timers != 1 {
			t.Fatalf("%d timers armed for %d entries, want 1", timers, i+1)
		}
	}
	clock.Advance(n * 10 * time.Millisecond)
	for _, j := range js {
		s.Idle(j)
	}
	if at := got.get(); len(at) != n {
		t.Fatalf("%d entries ran, want %d", len(at), n)
	}
	clock.Advance(10 * time.Millisecond)
	if timers := clock.Timers(); timers != 0 {
		t.Fatalf("%d timers armed once every entry was over, want 0", timers)
	}
}
