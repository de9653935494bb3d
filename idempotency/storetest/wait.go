package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

func waitChecks() []check {
	return []check{
		{name: "Wait/WokenByNotification", run: testWaitNotified},
		{name: "Wait/PollsWhenNotificationLost", needs: func(h *Harness) bool { return h.CompleteSilently != nil }, run: testWaitPolls},
		{name: "Wait/Released", run: testWaitReleased},
		{name: "Wait/TimesOut", run: testWaitTimesOut},
		{name: "Wait/Settled", run: testWaitSettled},
		{name: "Wait/ContextCancelled", run: testWaitCancelled},
		{name: "Wait/ManyWaitersManyKeys", run: testWaitDemux},
	}
}

type waited struct {
	rec   *idempotency.Record
	err   error
	began time.Time // just before Wait was called
	at    time.Time // when it returned
}

// goWait starts s.Wait in a goroutine; the channel delivers its return.
func goWait(ctx context.Context, s idempotency.Store, key string, max time.Duration) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		began := time.Now()
		rec, err := s.Wait(ctx, key, max)
		ch <- waited{rec, err, began, time.Now()}
	}()
	return ch
}

// notReturned fails if w returns within d: the waiter must still be waiting.
func notReturned(t *testing.T, w <-chan waited, d time.Duration, why string) {
	t.Helper()
	select {
	case r := <-w:
		t.Fatalf("Wait returned early (%s): %+v, %v", why, r.rec, r.err)
	case <-time.After(d):
	}
}

func returned(t *testing.T, w <-chan waited, within time.Duration) waited {
	t.Helper()
	select {
	case r := <-w:
		return r
	case <-time.After(within):
		t.Fatalf("Wait did not return within %s", within)
		return waited{}
	}
}

// A Wait re-reads after 50ms doubling to 1s: from the start of a Wait at
// 0, reads fall at 50, 150, 350, 750, 1550, 2550ms. Settling the key at
// backoffGrown leaves the next re-read, at rereadDue, almost a second away,
// so a return before it can only come from the notification.
const (
	backoffGrown = 1600 * time.Millisecond
	rereadDue    = 2550 * time.Millisecond
)

// woken fails unless r returned before the re-read due after backoffGrown
// (rereadDue from the start of its Wait): only the notification of what
// settled the key at settled could have woken it then. How soon the
// notification arrives is the machine's business; that it arrives before
// a re-read is the store's.
func woken(t *testing.T, r waited, settled time.Time, what string) {
	t.Helper()
	due := r.began.Add(rereadDue)
	if !settled.Before(due) {
		t.Fatalf("%s came %s after the Wait began, not before its re-read due at %s: the test cannot tell a notification from a re-read", what, settled.Sub(r.began), rereadDue)
	}
	if r.at.After(due) {
		t.Errorf("Wait returned %s after %s, later than its re-read due %s after it: not woken by the notification", r.at.Sub(settled), what, due.Sub(settled))
	}
}

func testWaitNotified(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	w := goWait(t.Context(), s, key, 10*time.Second)
	notReturned(t, w, backoffGrown, "the key is still claimed")
	settled := time.Now()
	mustComplete(t, s, c, "r")
	r := returned(t, w, 5*time.Second)
	if r.err != nil || r.rec == nil || r.rec.State != idempotency.StateCompleted || string(r.rec.Result) != "r" {
		t.Fatalf("Wait = %+v, %v; want the COMPLETED record", r.rec, r.err)
	}
	woken(t, r, settled, "Complete")
}

func testWaitPolls(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	w := goWait(t.Context(), s, key, 10*time.Second)
	notReturned(t, w, 800*time.Millisecond, "the key is still claimed")
	settled := time.Now()
	h.CompleteSilently(t, key, []byte("quiet"))
	r := returned(t, w, 5*time.Second)
	if r.err != nil || r.rec == nil || r.rec.State != idempotency.StateCompleted || string(r.rec.Result) != "quiet" {
		t.Fatalf("Wait = %+v, %v; want the COMPLETED record", r.rec, r.err)
	}
	// Re-reads are at most 1s apart: a lost notification costs latency only.
	if lat := r.at.Sub(settled); lat > 1500*time.Millisecond {
		t.Errorf("Wait returned %s after a silent completion; re-reads must be at most 1s apart", lat)
	}
}

func testWaitReleased(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	w := goWait(t.Context(), s, key, 10*time.Second)
	notReturned(t, w, backoffGrown, "the key is still claimed")
	settled := time.Now()
	if !release(t, s, key, c.Token, time.Minute) {
		t.Fatal("Release = false")
	}
	r := returned(t, w, 5*time.Second)
	if r.err != nil || r.rec != nil {
		t.Fatalf("Wait on a released key = %+v, %v; want nil (claim again)", r.rec, r.err)
	}
	woken(t, r, settled, "Release")
}

func testWaitTimesOut(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	const max = 400 * time.Millisecond
	start := time.Now()
	rec, err := s.Wait(ctxT(t), key, max)
	took := time.Since(start)
	if err != nil || rec == nil || rec.State != idempotency.StateClaimed || rec.Token != c.Token {
		t.Fatalf("Wait on a live claim = %+v, %v; want the CLAIMED record", rec, err)
	}
	if took < max || took > max+time.Second {
		t.Errorf("Wait(max %s) took %s", max, took)
	}
}

func testWaitSettled(t *testing.T, h *Harness) {
	s := h.Store
	start := time.Now()
	if rec, err := s.Wait(ctxT(t), newKey(t), 5*time.Second); err != nil || rec != nil {
		t.Errorf("Wait on an absent key = %+v, %v; want nil", rec, err)
	}
	key := newKey(t)
	c := mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	mustComplete(t, s, c, "r")
	rec, err := s.Wait(ctxT(t), key, 5*time.Second)
	if err != nil || rec == nil || rec.State != idempotency.StateCompleted {
		t.Errorf("Wait on a completed key = %+v, %v", rec, err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Wait on settled keys took %s; they need no waiting", took)
	}
	// max 0: one read, no waiting.
	key2 := newKey(t)
	mustOwn(t, s, req(key2, fp("a"), longLease), idempotency.ClaimNew)
	if rec, err := s.Wait(ctxT(t), key2, 0); err != nil || rec == nil || rec.State != idempotency.StateClaimed {
		t.Errorf("Wait(max 0) on a claimed key = %+v, %v; want the record at once", rec, err)
	}
}

func testWaitCancelled(t *testing.T, h *Harness) {
	s, key := h.Store, newKey(t)
	mustOwn(t, s, req(key, fp("a"), longLease), idempotency.ClaimNew)
	ctx, cancel := context.WithCancel(t.Context())
	w := goWait(ctx, s, key, 30*time.Second)
	notReturned(t, w, 200*time.Millisecond, "neither settled nor cancelled")
	cancel()
	r := returned(t, w, time.Second)
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("Wait after cancel = %+v, %v; want context.Canceled", r.rec, r.err)
	}
}

func testWaitDemux(t *testing.T, h *Harness) {
	s := h.Store
	a, b := newKey(t), newKey(t)
	ca := mustOwn(t, s, req(a, fp("a"), longLease), idempotency.ClaimNew)
	cb := mustOwn(t, s, req(b, fp("b"), longLease), idempotency.ClaimNew)
	const n = 8
	var wa, wb []<-chan waited
	for range n {
		wa = append(wa, goWait(t.Context(), s, a, 10*time.Second))
		wb = append(wb, goWait(t.Context(), s, b, 10*time.Second))
	}
	notReturned(t, wa[0], backoffGrown, "a is still claimed") // and every waiter's re-reads back off
	settled := time.Now()
	mustComplete(t, s, ca, "ra")
	for i, w := range wa {
		r := returned(t, w, 5*time.Second)
		if r.err != nil || r.rec == nil || string(r.rec.Result) != "ra" {
			t.Fatalf("waiter %d of a: %+v, %v", i, r.rec, r.err)
		}
		woken(t, r, settled, fmt.Sprintf("the Complete of a (waiter %d)", i))
	}
	for i, w := range wb {
		select {
		case r := <-w:
			t.Fatalf("waiter %d of b returned when a completed: %+v, %v", i, r.rec, r.err)
		default:
		}
	}
	if !release(t, s, b, cb.Token, time.Minute) {
		t.Fatal("Release(b) = false")
	}
	for i, w := range wb {
		if r := returned(t, w, 5*time.Second); r.err != nil || r.rec != nil {
			t.Errorf("waiter %d of b after Release: %+v, %v; want nil", i, r.rec, r.err)
		}
	}
}
