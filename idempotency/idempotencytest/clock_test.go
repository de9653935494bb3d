package idempotencytest_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency/idempotencytest"
)

func TestClockFiresTimersInOrderAtTheirDueTime(t *testing.T) {
	c := idempotencytest.NewClock(time.Time{})
	t0 := c.Now()
	var fired []string
	record := func(name string) func() {
		return func() { fired = append(fired, fmt.Sprintf("%s@%s", name, c.Now().Sub(t0))) }
	}
	c.AfterFunc(30*time.Millisecond, record("c"))
	c.AfterFunc(10*time.Millisecond, record("a"))
	c.AfterFunc(20*time.Millisecond, record("b1"))
	c.AfterFunc(20*time.Millisecond, record("b2"))
	c.AfterFunc(time.Second, record("late"))
	if n := c.Timers(); n != 5 {
		t.Fatalf("Timers() = %d, want 5", n)
	}
	c.Advance(9 * time.Millisecond)
	if len(fired) != 0 {
		t.Fatalf("fired %v before any timer was due", fired)
	}
	c.Advance(21 * time.Millisecond)
	want := []string{"a@10ms", "b1@20ms", "b2@20ms", "c@30ms"}
	if fmt.Sprint(fired) != fmt.Sprint(want) {
		t.Fatalf("fired %v, want %v", fired, want)
	}
	if got := c.Now().Sub(t0); got != 30*time.Millisecond {
		t.Fatalf("Now = t0+%s after advancing 30ms, want t0+30ms", got)
	}
	if n := c.Timers(); n != 1 {
		t.Fatalf("Timers() = %d, want 1 (late)", n)
	}
}

func TestClockStopAndReset(t *testing.T) {
	c := idempotencytest.NewClock(time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC))
	n := 0
	tm := c.AfterFunc(time.Second, func() { n++ })
	if !tm.Stop() {
		t.Fatal("Stop of an armed timer = false, want true")
	}
	if tm.Stop() {
		t.Fatal("Stop of a stopped timer = true, want false")
	}
	c.Advance(time.Hour)
	if n != 0 {
		t.Fatalf("a stopped timer fired %d times", n)
	}
	if tm.Reset(time.Minute) {
		t.Fatal("Reset of a stopped timer = true, want false")
	}
	c.Advance(59 * time.Second)
	if n != 0 {
		t.Fatal("a reset timer fired before its new due time")
	}
	c.Advance(time.Second)
	if n != 1 {
		t.Fatalf("a reset timer fired %d times at its due time, want 1", n)
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a fired timer = true, want false")
	}
	if !tm.Reset(2 * time.Second) {
		t.Fatal("Reset of an armed timer = false, want true")
	}
	c.Advance(time.Second)
	if n != 1 {
		t.Fatal("Reset did not move the due time")
	}
	c.Advance(time.Second)
	if n != 2 {
		t.Fatalf("fired %d times, want 2", n)
	}
}

// A timer that its function arms again within the advanced span fires
// again in the same Advance, as a ticker would.
func TestClockRearmedTimerFiresAgainWithinAdvance(t *testing.T) {
	c := idempotencytest.NewClock(time.Time{})
	t0 := c.Now()
	var at []time.Duration
	var tm interface{ Reset(time.Duration) bool }
	tm = c.AfterFunc(100*time.Millisecond, func() {
		at = append(at, c.Now().Sub(t0))
		tm.Reset(100 * time.Millisecond)
	})
	c.Advance(350 * time.Millisecond)
	if fmt.Sprint(at) != "[100ms 200ms 300ms]" {
		t.Fatalf("fired at %v, want [100ms 200ms 300ms]", at)
	}
	if n := c.Timers(); n != 1 {
		t.Fatalf("Timers() = %d, want 1", n)
	}
}

func ExampleClock() {
	c := idempotencytest.NewClock(time.Time{})
	c.AfterFunc(time.Second, func() { fmt.Println("renew at", c.Now().Format(time.TimeOnly)) })
	c.Advance(999 * time.Millisecond)
	fmt.Println("nothing due yet at", c.Now().Format(time.StampMilli))
	c.Advance(time.Millisecond)
	// Output:
	// nothing due yet at Jan  1 00:00:00.999
	// renew at 00:00:01
}
