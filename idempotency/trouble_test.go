package idempotency

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A batcher with node trouble sends one call for all nodes while they are
// healthy; once a node failed a key, that node's requests go to its own
// batcher, so that while its calls hang the other nodes' requests are
// answered.
func TestTroubledNodeGoesApart(t *testing.T) {
	var mode atomic.Value // node b: "", "fail", "hang"
	mode.Store("")
	unhang := make(chan struct{})
	hanging := make(chan struct{}, 8) // a call starts to hang
	var calls atomic.Int32
	send := func(ctx context.Context, keys []string) ([]string, error) {
		calls.Add(1)
		errs := make([]error, len(keys))
		failed := false
		for i, k := range keys {
			if !strings.HasPrefix(k, "b") {
				continue
			}
			switch mode.Load() {
			case "fail":
				errs[i], failed = &NodeError{Node: "b", Err: fmt.Errorf("%w: down", ErrStoreUnavailable)}, true
			case "hang":
				hanging <- struct{}{}
				select {
				case <-ctx.Done():
				case <-unhang:
				}
				errs[i], failed = &NodeError{Node: "b", Err: fmt.Errorf("%w: hung", ErrStoreUnavailable)}, true
			}
		}
		if failed {
			return keys, &BatchError{Errs: errs}
		}
		return keys, nil
	}
	b := newBatcher("test", 20*time.Second, func(k string) string { return k }, send)
	b.maxFlights = 1
	b.route = func(_ context.Context, k string) string { return k[:1] }
	b.trouble = &nodeTrouble{}
	t.Cleanup(b.wait)

	ctx := t.Context()
	res, errs := b.doAll(ctx, []string{"a1", "b1", "a2"}, false)
	if errs[0] != nil || errs[1] != nil || errs[2] != nil || res[1] != "b1" || calls.Load() != 1 {
		t.Fatalf("healthy batch: %v %v in %d calls; want every key answered in one call", res, errs, calls.Load())
	}
	mode.Store("fail")
	if _, err := b.do(ctx, "b2", false); err == nil {
		t.Fatal("b2 on the failing node: no error")
	}
	mode.Store("hang")
	hung := make(chan error, 1)
	go func() {
		_, err := b.do(ctx, "b3", false)
		hung <- err
	}()
	select {
	case <-hanging:
	case <-time.After(5 * time.Second):
		t.Fatal("b3's call was not sent")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := b.do(ctx, "a3", false); err != nil {
			t.Errorf("a3: %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a3 of a healthy node waited for the hanging node b")
	}
	mode.Store("")
	close(unhang)
	if err := <-hung; err == nil {
		t.Fatal("b3's hung call: no error")
	}
	if _, err := b.do(ctx, "b4", false); err != nil {
		t.Fatalf("b4 once node b answers: %v", err)
	}
	if b.trouble.any() {
		t.Fatal("node b still in trouble after a call of its own succeeded")
	}
}
