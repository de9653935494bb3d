package kafkasource

import "github.com/segmentio/kafka-go"

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

// FetchBudget returns how many bytes of s's FetchBufferBytes are held now,
// the most ever held, and how many fetchers wait for room.
func FetchBudget(s *Source) (used, peak int64, waiting int) { return s.budget.State() }

// MessageCost is what the budget counts for m.
func MessageCost(m *kafka.Message) int64 { return messageCost(m) }

// MaxUnfinished is the MaxUnfinished a member of s keeps per partition for
// a runner that batches or not.
func MaxUnfinished(s *Source, batching bool) int { return s.unfinishedFor(batching) }

// WidestRound is the most partitions one shared fetch has carried.
func WidestRound(s *Source) int { return int(s.widestRound.Load()) }
