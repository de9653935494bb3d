package kafkasource

// SimulateCrash makes s never commit again, as if the process died before
// its next commit.
func SimulateCrash(s *Source) { s.noCommit.Store(true) }

// Tracker exposes the offset tracker to tests.
type Tracker = tracker

// Add, Finish, Advance, Watermark and Pending are the tracker's methods.
func (t *Tracker) Add(off int64)     { t.add(off) }
func (t *Tracker) Finish(off int64)  { t.finish(off) }
func (t *Tracker) Advance(n int64)   { t.advance(n) }
func (t *Tracker) Watermark() int64  { return t.watermark() }
func (t *Tracker) Pending() int      { return t.pending() }
func NewTracker(next int64) *Tracker { return &Tracker{next: next} }

// DisableKeeper turns off s's group keeper (group.go), to measure what the
// keeper is for.
func DisableKeeper(s *Source) { s.noKeeper.Store(true) }
