package ctxshare

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

type key string

// within fails unless ch is closed within d.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not done within %s", what, d)
	}
}

func TestDeadlinesShareAndBound(t *testing.T) {
	s := &Deadlines{D: time.Hour}
	before := time.Now()
	const n = 64
	ctxs := make([]context.Context, n)
	var wg sync.WaitGroup
	for i := range ctxs {
		wg.Go(func() { ctxs[i] = s.Ctx() })
	}
	wg.Wait()
	after := time.Now()
	for i, c := range ctxs {
		if c != ctxs[0] {
			t.Fatalf("call %d got another context: calls within D/8 share one", i)
		}
		at, ok := c.Deadline()
		if !ok {
			t.Fatal("no deadline")
		}
		if at.Before(before.Add(s.D)) || at.After(after.Add(s.D+s.D/8)) {
			t.Fatalf("deadline %s from now, want between D and D+D/8", time.Until(at))
		}
		if c.Err() != nil {
			t.Fatalf("context ended before its deadline: %v", c.Err())
		}
		if c.Value(key("k")) != nil {
			t.Fatal("a shared deadline context carries a value")
		}
	}
}

func TestDeadlinesRenewBeforeTooLittleIsLeft(t *testing.T) {
	s := &Deadlines{D: 80 * time.Millisecond}
	first := s.Ctx()
	at, _ := first.Deadline()
	// Once less than D is left on the shared one, a new context is made.
	deadline := time.Now().Add(5 * time.Second)
	for time.Until(at) >= s.D {
		if time.Now().After(deadline) {
			t.Fatal("the shared deadline never came within D")
		}
		time.Sleep(time.Millisecond)
	}
	next := s.Ctx()
	if next == first {
		t.Fatal("a context with less than D left was handed out")
	}
	if nat, _ := next.Deadline(); time.Until(nat) < s.D {
		t.Fatalf("new context has %s left, want at least %s", time.Until(nat), s.D)
	}
	within(t, first.Done(), 5*time.Second, "the first context at its deadline")
	if !errors.Is(first.Err(), context.DeadlineExceeded) {
		t.Fatalf("first context ended with %v, want DeadlineExceeded", first.Err())
	}
}

func TestWithValuesTakesValuesOfOneAndEndOfTheOther(t *testing.T) {
	vals, cancelVals := context.WithCancel(context.WithValue(context.Background(), key("span"), "s1"))
	dl, cancelDL := context.WithCancelCause(context.WithValue(context.Background(), key("only-deadline"), "d"))
	c := WithValues(dl, vals)
	if c.Value(key("span")) != "s1" || c.Value(key("only-deadline")) != "d" {
		t.Fatalf("values: span %v, only-deadline %v", c.Value(key("span")), c.Value(key("only-deadline")))
	}
	cancelVals()
	derived, cancelDerived := context.WithCancel(c)
	defer cancelDerived()
	if c.Err() != nil || derived.Err() != nil {
		t.Fatal("the values context's cancellation reached the result")
	}
	cause := errors.New("settle deadline")
	cancelDL(cause)
	within(t, c.Done(), 5*time.Second, "the result on the deadline context's end")
	within(t, derived.Done(), 5*time.Second, "a context derived from the result")
	if got := context.Cause(derived); got != cause {
		t.Fatalf("Cause of a derived context = %v, want the deadline context's", got)
	}
	if got := context.Cause(c); got != cause {
		t.Fatalf("Cause = %v, want the deadline context's", got)
	}
}

func TestBindUncancellableIsSharedAndEndsWithWork(t *testing.T) {
	var b Binder
	work, stopWork := context.WithCancelCause(context.Background())
	src := context.WithoutCancel(context.WithValue(context.Background(), key("k"), "v"))
	const n = 64
	got := make([]context.Context, n)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			c, cancel := b.Bind(src, work)
			cancel() // a no-op for a shared context
			got[i] = c
		})
	}
	wg.Wait()
	c := got[0]
	if c.Value(key("k")) != "v" {
		t.Fatal("the bound context lost the source's value")
	}
	if c.Err() != nil {
		t.Fatal("cancel of a shared context ended it")
	}
	if again, _ := b.Bind(src, work); again != c {
		t.Fatal("a later call with the same context got another binding")
	}
	derived, cancel := context.WithCancel(c)
	defer cancel()
	cause := errors.New("drain ran out")
	stopWork(cause)
	for i, g := range got {
		within(t, g.Done(), 5*time.Second, "a binding on the work context's end")
		if context.Cause(g) != cause {
			t.Fatalf("binding %d: Cause = %v, want the work context's", i, context.Cause(g))
		}
	}
	within(t, derived.Done(), 5*time.Second, "a context derived from a binding")
	if context.Cause(derived) != cause {
		t.Fatalf("derived: Cause = %v, want the work context's", context.Cause(derived))
	}
}

func TestBindCancellableIsSharedWhileItLives(t *testing.T) {
	var b Binder
	work, stopWork := context.WithCancelCause(context.Background())
	defer stopWork(nil)
	part, revoke := context.WithCancelCause(context.WithValue(context.Background(), key("partition"), 3))
	var wg sync.WaitGroup
	got := make([]context.Context, 32)
	for i := range got {
		wg.Go(func() {
			c, cancel := b.Bind(part, work)
			cancel()
			got[i] = c
		})
	}
	wg.Wait()
	for i, g := range got {
		if g != got[0] {
			t.Fatalf("call %d got another binding of a live context", i)
		}
	}
	if got[0].Value(key("partition")) != 3 || got[0].Err() != nil {
		t.Fatal("the shared binding lost the value or ended early")
	}
	if n := b.live(); n != 1 {
		t.Fatalf("%d shared bindings, want 1", n)
	}
	revoked := errors.New("partition revoked")
	revoke(revoked)
	within(t, got[0].Done(), 5*time.Second, "the binding on its source's end")
	if context.Cause(got[0]) != revoked {
		t.Fatalf("Cause = %v, want the source's", context.Cause(got[0]))
	}
	// Forgotten once it ended, so a new context of the same source binds anew.
	deadline := time.Now().Add(5 * time.Second)
	for b.live() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("an ended shared binding was not forgotten")
		}
		time.Sleep(time.Millisecond)
	}
	next, cancel := b.Bind(context.WithValue(work, key("partition"), 4), work)
	defer cancel()
	if next.Err() != nil || next.Value(key("partition")) != 4 {
		t.Fatal("a new context after a revocation was not bound afresh")
	}
	stopWork(errors.New("stop"))
	within(t, next.Done(), 5*time.Second, "a shared binding on the work context's end")
}

// valueCtx is a context.Context that is not a pointer type.
type valueCtx struct{ context.Context }

func TestBindPerCallBeyondMaxSharedOrForNonPointers(t *testing.T) {
	var b Binder
	work, stopWork := context.WithCancelCause(context.Background())
	parent, cancelParents := context.WithCancel(context.Background())
	defer cancelParents()
	var cancels []context.CancelFunc
	for range MaxShared {
		c, cancel := context.WithCancel(parent)
		cancels = append(cancels, cancel)
		b.Bind(c, work)
	}
	if n := b.live(); n != MaxShared {
		t.Fatalf("%d shared bindings, want MaxShared", n)
	}
	over, cancelOver := context.WithCancel(parent)
	defer cancelOver()
	c1, done1 := b.Bind(over, work)
	c2, done2 := b.Bind(over, work)
	if c1 == c2 {
		t.Fatal("past MaxShared, two calls shared a binding")
	}
	done1()
	if c1.Err() == nil {
		t.Fatal("the CancelFunc of a per-call binding did not end it")
	}
	nonPtr := valueCtx{parent}
	c3, done3 := b.Bind(nonPtr, work)
	c4, done4 := b.Bind(nonPtr, work)
	if c3 == c4 {
		t.Fatal("a non-pointer context was shared")
	}
	done3()
	cause := errors.New("drain ran out")
	stopWork(cause)
	for _, c := range []context.Context{c2, c4} {
		within(t, c.Done(), 5*time.Second, "a per-call binding on the work context's end")
		if context.Cause(c) != cause {
			t.Fatalf("Cause = %v, want the work context's", context.Cause(c))
		}
	}
	done2()
	done4()
	for _, cancel := range cancels {
		cancel()
	}
}

type carrierKey struct{}

func TestCarrierValueAndParent(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key("k"), "parent's"))
	var c Carrier[carrierKey, int]
	c.Bind(parent)
	c.Val = 7
	child, stop := context.WithCancel(&c)
	defer stop()
	p, ok := child.Value(carrierKey{}).(*int)
	if !ok || p != &c.Val || *p != 7 {
		t.Fatalf("Value(carrierKey{}) = %v, want a pointer to Val", child.Value(carrierKey{}))
	}
	if v := child.Value(key("k")); v != "parent's" {
		t.Fatalf("Value(k) = %v, want the parent's value", v)
	}
	if child.Value(key("other")) != nil {
		t.Fatal("a key nobody set has a value")
	}
	cause := errors.New("parent cancelled")
	cancel(cause)
	within(t, child.Done(), 5*time.Second, "a context derived from the carrier")
	if !errors.Is(context.Cause(child), cause) {
		t.Fatalf("Cause = %v, want the parent's cause", context.Cause(child))
	}
}

func TestCarrierConcurrentValues(t *testing.T) {
	var c Carrier[carrierKey, string]
	c.Bind(context.Background())
	c.Val = "run"
	ctx, stop := context.WithCancel(&c)
	defer stop()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if p := ctx.Value(carrierKey{}).(*string); *p != "run" {
					t.Errorf("Value = %q", *p)
					return
				}
			}
		})
	}
	wg.Wait()
}
