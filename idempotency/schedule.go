package idempotency

import (
	"sync"
	"time"

	"github.com/idemkit/dedupworker/internal/ilist"
)

// renewJob is what a schedule runs: one handler run's lease renewals.
type renewJob interface {
	// renew renews once and returns when to renew next, or false when the
	// renewals are over.
	renew() (next time.Duration, again bool)
}

// schedule runs the lease renewals of one processor's running handlers:
// a list of entries, and one timer of its clock that, while the list is not
// empty, looks every tick for entries due and runs each on a goroutine of
// its own. A renewal is late by at most a tick.
//
// It is neither a goroutine nor a timer per run: most handlers finish long
// before their first renewal, so a run costs a list insertion and removal
// (BenchmarkEngine's allocs/op guards it).
type schedule struct {
	clock Clock
	tick  time.Duration

	mu    sync.Mutex
	list  ilist.List[entry, *entry]
	timer Timer // nil until the first add; armed while the list is not empty
	armed bool
}

// entry is one job's place in a schedule. Its zero value is ready for add;
// it is reusable after stop.
type entry struct {
	job renewJob

	// Guarded by the schedule's mu:
	ilist.Links[entry]
	listed bool      // in the list: not stopped, not over
	due    time.Time // when to run next
	firing bool      // a run is in progress or about to start
	busy   sync.WaitGroup
}

// add lists e to run job at due, then again as job says.
func (s *schedule) add(e *entry, job renewJob, due time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.job, e.due, e.listed = job, due, true
	s.list.PushBack(e)
	if s.armed {
		return
	}
	s.armed = true
	if s.timer == nil {
		s.timer = s.clock.AfterFunc(s.tick, s.scan)
	} else {
		s.timer.Reset(s.tick)
	}
}

// stop takes e off the list and waits for a run in progress: its job is
// not run after stop returns.
func (s *schedule) stop(e *entry) {
	s.mu.Lock()
	s.unlink(e)
	s.mu.Unlock()
	e.busy.Wait()
}

// unlink takes e off the list; s.mu is held.
func (s *schedule) unlink(e *entry) {
	if !e.listed {
		return
	}
	s.list.Remove(e)
	e.listed = false
}

// scan starts the entries that are due, and arms the timer again while
// the list is not empty.
func (s *schedule) scan() {
	now := s.clock.Now()
	var due []*entry
	s.mu.Lock()
	for e := s.list.Front(); e != nil; e = e.Next() {
		if !e.firing && !e.due.After(now) {
			e.firing = true
			e.busy.Add(1)
			due = append(due, e)
		}
	}
	if s.list.Front() != nil {
		s.timer.Reset(s.tick)
	} else {
		s.armed = false
	}
	s.mu.Unlock()
	for _, e := range due {
		go s.fire(e)
	}
}

// fire runs e's job once, unless e was stopped meanwhile, then lists it
// for its next run or takes it off the list. Runs of one entry never
// overlap.
func (s *schedule) fire(e *entry) {
	defer e.busy.Done()
	s.mu.Lock()
	stopped := !e.listed
	s.mu.Unlock()
	var (
		next  time.Duration
		again bool
	)
	if !stopped {
		next, again = e.job.renew()
	}
	s.mu.Lock()
	e.firing = false
	if again && e.listed {
		e.due = s.clock.Now().Add(next)
	} else {
		s.unlink(e)
	}
	s.mu.Unlock()
}
