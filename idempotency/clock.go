package idempotency

import "time"

// Clock is the engine's local time: the moments it estimates a lease's end
// from, and the timer that sends lease renewals. Leases themselves follow
// the store's clock (Redis TIME); a Clock only decides when the
// engine renews. Tests inject idempotencytest.Clock to drive renewals
// without waiting; Config's default is the system clock.
type Clock interface {
	// Now returns the current local time.
	Now() time.Time
	// AfterFunc calls f once d has passed, as time.AfterFunc does. f
	// must not rely on the goroutine it runs on: the system clock starts
	// one, idempotencytest.Clock runs f inside its Advance.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a timer made by Clock.AfterFunc; *time.Timer is one.
type Timer interface {
	// Stop prevents the call; it reports whether the timer was armed.
	Stop() bool
	// Reset arms the timer to call again after d; it reports whether the
	// timer was armed.
	Reset(d time.Duration) bool
}

// systemClock is the Clock of time.Now and time.AfterFunc.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
