package bytebudget

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// acquireAsync starts Acquire(n) and returns a channel with its result.
func acquireAsync(ctx context.Context, b *Budget, n int64) <-chan error {
	done := make(chan error, 1)
	go func() { done <- b.Acquire(ctx, n) }()
	return done
}

// waitWaiting returns once b has n waiters, failing the test after 10s.
func waitWaiting(t *testing.T, b *Budget, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d waiters", n), func() bool {
		_, _, w := b.State()
		return w == n
	})
}

func granted(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: acquire returned %v, want nil", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not granted within 10s", what)
	}
}

func notGranted(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s: acquire returned (%v) while it must wait", what, err)
	default:
	}
}

// TestBudgetFirstComeFirstServed: a waiter is granted only after every
// earlier one, even when a later, smaller one would fit: a large fetch is
// not overtaken forever by small ones.
func TestBudgetFirstComeFirstServed(t *testing.T) {
	b := New(100)
	ctx := context.Background()
	if err := b.Acquire(ctx, 60); err != nil {
		t.Fatal(err)
	}
	big := acquireAsync(ctx, b, 80)
	waitWaiting(t, b, 1)
	small := acquireAsync(ctx, b, 10) // would fit (70 ≤ 100), but big came first
	waitWaiting(t, b, 2)
	notGranted(t, big, "80 with 60 used")
	notGranted(t, small, "10 behind a waiting 80")

	b.Release(60)
	granted(t, big, "80 once 60 came back")
	granted(t, small, "10 behind the granted 80")
	if used, peak, w := b.State(); used != 90 || peak != 90 || w != 0 {
		t.Fatalf("state = used %d, peak %d, %d waiting; want 90, 90, 0", used, peak, w)
	}
}

// TestBudgetCancelledWaiterLetsOthersThrough: a waiter whose context ends
// leaves the queue holding nothing, and those behind it that fit are
// granted.
func TestBudgetCancelledWaiterLetsOthersThrough(t *testing.T) {
	b := New(100)
	if err := b.Acquire(context.Background(), 50); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	big := acquireAsync(ctx, b, 100)
	waitWaiting(t, b, 1)
	small := acquireAsync(context.Background(), b, 30)
	waitWaiting(t, b, 2)
	cancel()
	select {
	case err := <-big:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled acquire returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled acquire did not return within 10s")
	}
	granted(t, small, "30 behind a cancelled 100")
	if used, _, w := b.State(); used != 80 || w != 0 {
		t.Fatalf("state = used %d, %d waiting; want 80, 0", used, w)
	}
}

// TestBudgetTakeExceedsAndBlocks: Take goes past the budget without
// waiting, and nobody is granted until enough comes back; Capped keeps a
// request within what the budget can ever grant.
func TestBudgetTakeExceedsAndBlocks(t *testing.T) {
	b := New(100)
	b.Take(150)
	if got := b.Capped(1 << 40); got != 100 {
		t.Fatalf("capped(1<<40) = %d, want the whole budget 100", got)
	}
	w := acquireAsync(context.Background(), b, b.Capped(1<<40))
	waitWaiting(t, b, 1)
	b.Release(100)
	notGranted(t, w, "the whole budget with 50 still used")
	b.Release(50)
	granted(t, w, "the whole budget once everything came back")
	if used, peak, _ := b.State(); used != 100 || peak != 150 {
		t.Fatalf("state = used %d, peak %d; want 100, 150", used, peak)
	}
}

// TestBudgetStatsCountWaiting: Stats reports the size and what is held,
// and sums the time of the acquisitions that waited, granted, given up or
// still waiting, and none for one granted at once.
func TestBudgetStatsCountWaiting(t *testing.T) {
	b := New(100)
	if err := b.Acquire(context.Background(), 60); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Size != 100 || st.Held != 60 || st.Waited != 0 {
		t.Fatalf("stats = %+v after an acquisition granted at once, want size 100, held 60, no wait", st)
	}
	w := acquireAsync(context.Background(), b, 60)
	waitWaiting(t, b, 1)
	time.Sleep(20 * time.Millisecond) // the wait to be measured, not a synchronisation
	if st := b.Stats(); st.Waited < 20*time.Millisecond {
		t.Fatalf("Waited = %v while an acquisition has waited at least 20ms and still waits, want at least that", st.Waited)
	}
	b.Release(60)
	granted(t, w, "60 once 60 came back")
	first := b.Stats().Waited
	if first < 20*time.Millisecond {
		t.Fatalf("Waited = %v after an acquisition waited at least 20ms, want at least that", first)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w = acquireAsync(ctx, b, 60)
	waitWaiting(t, b, 1)
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-w; !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire = %v, want context.Canceled", err)
	}
	if st := b.Stats(); st.Waited < first+20*time.Millisecond || st.Held != 60 {
		t.Fatalf("stats = %+v after a second wait of at least 20ms was given up, want Waited at least %v and held 60", st, first+20*time.Millisecond)
	}
}

// TestHeaderMapCostGrowsPastOneGroup: a header map of one group of slots
// costs the same whatever its keys, and a larger one more.
func TestHeaderMapCostGrowsPastOneGroup(t *testing.T) {
	if one, full := HeaderMapCost(1), HeaderMapCost(mapGroupSlots); one != full || one != headerMapSmall {
		t.Errorf("HeaderMapCost(1) = %d, HeaderMapCost(%d) = %d, want both %d", one, mapGroupSlots, full, headerMapSmall)
	}
	if small, large := HeaderMapCost(mapGroupSlots), HeaderMapCost(mapGroupSlots+1); large <= small {
		t.Errorf("a header map of %d keys costs %d, of %d keys %d: want it to grow past one group", mapGroupSlots, small, mapGroupSlots+1, large)
	}
}
