package idempotency

import "time"

// RenewSchedule exposes the lease-renewal schedule to the external tests,
// which drive it with idempotencytest.Clock (that package imports this one).
type RenewSchedule struct{ s schedule }

// NewRenewSchedule returns a schedule on c that scans every tick.
func NewRenewSchedule(c Clock, tick time.Duration) *RenewSchedule {
	return &RenewSchedule{s: schedule{clock: c, tick: tick}}
}

// RenewEntry is a job listed in a RenewSchedule.
type RenewEntry struct {
	e  entry
	fn func() (time.Duration, bool)
}

func (j *RenewEntry) renew() (time.Duration, bool) { return j.fn() }

// Add lists fn to run at due, then again after the duration it returns
// while it returns true.
func (s *RenewSchedule) Add(due time.Time, fn func() (time.Duration, bool)) *RenewEntry {
	j := &RenewEntry{fn: fn}
	s.s.add(&j.e, j, due)
	return j
}

// Stop takes j off the schedule and waits for a run in progress.
func (s *RenewSchedule) Stop(j *RenewEntry) { s.s.stop(&j.e) }

// Idle waits for a run of j that a scan started: after an Advance of the
// fake clock, every run due by then has finished once Idle returns.
func (s *RenewSchedule) Idle(j *RenewEntry) { j.e.busy.Wait() }

// Listed reports whether j is on the schedule.
func (s *RenewSchedule) Listed(j *RenewEntry) bool {
	s.s.mu.Lock()
	defer s.s.mu.Unlock()
	return j.e.listed
}

// PrepareQueued is how many of Prepare's claims wait for the call in flight.
func (e *Engine) PrepareQueued() int {
	e.preparer.mu.Lock()
	defer e.preparer.mu.Unlock()
	return len(e.preparer.pending)
}

// CompletionsQueued is how many completions wait for a store call.
func (e *Engine) CompletionsQueued() int {
	e.completer.mu.Lock()
	defer e.completer.mu.Unlock()
	return len(e.completer.pending)
}
