package idempotencytest

import (
	"sync"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

// Clock is an idempotency.Clock whose time moves only in Advance. Timers
// made by AfterFunc call their function from Advance, on the goroutine that
// called it, one after another in the order they are due. It is safe for
// concurrent use.
type Clock struct {
	mu    sync.Mutex
	now   time.Time
	armed map[*timer]struct{}
	seq   uint64 // counts armings, to fire timers due at once in arming order
}

var _ idempotency.Clock = (*Clock)(nil)

// NewClock returns a Clock reading start; the zero time starts it at
// 2026-01-01 00:00 UTC.
func NewClock(start time.Time) *Clock {
	if start.IsZero() {
		start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return &Clock{now: start, armed: make(map[*timer]struct{})}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc returns a timer that calls f from the Advance that moves the
// clock d or more past now.
func (c *Clock) AfterFunc(d time.Duration, f func()) idempotency.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, f: f}
	c.arm(t, d)
	return t
}

// Advance moves the clock forward by d. Every timer due by then fires at
// its due time, in order: during its function Now returns that time, and a
// timer the function arms again within the advanced span fires again in the
// same Advance. It returns when the clock reads the new time and no timer
// due by then is left. A timer armed for no time at all, again and again,
// keeps it from returning, as it would keep a real clock's timers firing.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *timer
		for t := range c.armed {
			if !t.at.After(end) && (next == nil || t.at.Before(next.at) || t.at.Equal(next.at) && t.seq < next.seq) {
				next = t
			}
		}
		if next == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		if next.at.After(c.now) {
			c.now = next.at
		}
		delete(c.armed, next)
		f := next.f
		c.mu.Unlock()
		f()
	}
}

// Timers returns how many timers are armed.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.armed)
}

// arm arms t to fire d from now; c.mu is held.
func (c *Clock) arm(t *timer, d time.Duration) {
	c.seq++
	t.at, t.seq = c.now.Add(d), c.seq
	c.armed[t] = struct{}{}
}

// timer is a timer of a Clock.
type timer struct {
	c   *Clock
	f   func()
	at  time.Time // due time, while armed
	seq uint64    // when it was armed
}

// Stop disarms the timer; it reports whether it was armed.
func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, was := t.c.armed[t]
	delete(t.c.armed, t)
	return was
}

// Reset arms the timer to fire d after the clock's time; it reports
// whether it was armed.
func (t *timer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, was := t.c.armed[t]
	t.c.arm(t, d)
	return was
}
