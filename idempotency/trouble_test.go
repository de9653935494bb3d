package idempotency

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// twoNodes is a batcher's send over two nodes: keys that start with "b"
// live on node b, which can fail its keys or hang until the call's context
// ends or unhang is closed (then failing them); the others live on node a,
// which always answers.
type twoNodes struct {
	mode    atomic.Value // node b: "", "fail", "hang"
	unhang  chan struct{}
	hanging chan struct{} // a call starts to hang on node b
	calls   atomic.Int32
}

func newTwoNodes(mode string) *twoNodes {
	n := &twoNodes{unhang: make(chan struct{}), hanging: make(chan struct{}, 8)}
	n.mode.Store(mode)
	return n
}

func (n *twoNodes) send(ctx context.Context, keys []string) ([]string, error) {
	n.calls.Add(1)
	errs := make([]error, len(keys))
	failed := false
	for i, k := range keys {
		if !strings.HasPrefix(k, "b") {
			continue
		}
		switch n.mode.Load() {
		case "fail":
			errs[i], failed = &NodeError{Node: "b", Err: fmt.Errorf("%w: down", ErrStoreUnavailable)}, true
		case "hang":
			n.hanging <- struct{}{}
			select {
			case <-ctx.Done():
			case <-n.unhang:
			}
			errs[i], failed = &NodeError{Node: "b", Err: fmt.Errorf("%w: hung", ErrStoreUnavailable)}, true
		}
	}
	if failed {
		return keys, &BatchError{Errs: errs}
	}
	return keys, nil
}

// batcher returns a batcher over the two nodes, with node trouble, one
// flight and a timeout far beyond the tests' waits.
func (n *twoNodes) batcher() *batcher[string, string] {
	b := newBatcher("test", 20*time.Second, func(k string) string { return k }, n.send)
	b.maxFlights = 1
	b.route = func(_ context.Context, k string) string { return k[:1] }
	b.trouble = &nodeTrouble{}
	return b
}

// A batcher with node trouble takes one batch for all nodes while they are
// healthy, sent as a call a node; once a node failed a key, that node's requests go to its own
// batcher, so that while its calls hang the other nodes' requests are
// answered.
func TestTroubledNodeGoesApart(t *testing.T) {
	nodes := newTwoNodes("")
	mode, unhang, hanging, calls := &nodes.mode, nodes.unhang, nodes.hanging, &nodes.calls
	b := nodes.batcher()
	t.Cleanup(b.wait)

	ctx := t.Context()
	res, errs := b.doAll(ctx, []string{"a1", "b1", "a2"}, false)
	if errs[0] != nil || errs[1] != nil || errs[2] != nil || res[1] != "b1" || calls.Load() != 2 {
		t.Fatalf("healthy batch: %v %v in %d calls; want every key answered, in a call a node", res, errs, calls.Load())
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

// When a node starts to hang before any of its calls failed, the calls
// that span it answer the other nodes' keys when their node answers, and
// the hanging node is put in trouble once it is slow, so that the next
// batches do not wait for it either.
func TestHangOnsetHoldsBackOnlyItsNode(t *testing.T) {
	// hedge: the completer's way, one call for all nodes and apart once
	// it is slow; else apart at once, the claimers' way.
	for _, hedge := range []bool{false, true} {
		t.Run(fmt.Sprintf("hedge %v", hedge), func(t *testing.T) { testHangOnset(t, hedge) })
	}
}

func testHangOnset(t *testing.T, hedge bool) {
	nodes := newTwoNodes("hang")
	unhang, hanging := nodes.unhang, nodes.hanging
	b := nodes.batcher()
	b.hedge = hedge // maxFlights 1, as the preparer's: a flight held by node b would hold back every key
	t.Cleanup(b.wait)
	t.Cleanup(func() { close(unhang) })

	// A batch of node b's keys alone, first: its call hangs.
	b.doEach(t.Context(), []string{"b0"}, []int{0}, false, func(int, string, error) {})
	select {
	case <-hanging:
	case <-time.After(5 * time.Second):
		t.Fatal("b0's call was not sent")
	}

	type answer struct {
		key string
		err error
	}
	answers := make(chan answer, 8)
	keys := []string{"a1", "b1", "a2"}
	b.doEach(t.Context(), keys, []int{0, 1, 2}, false, func(i int, _ string, err error) {
		answers <- answer{keys[i], err}
	})
	for range 2 {
		select {
		case a := <-answers:
			if a.err != nil || a.key == "b1" {
				t.Fatalf("answer %s: %v; want a1 and a2 answered without error first", a.key, a.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the keys of node a, in a call with node b's hanging key, were not answered in 5s")
		}
	}
	select {
	case <-hanging:
	case <-time.After(5 * time.Second):
		t.Fatal("b1's call was not sent")
	}
	// The next batches: node a's keys are answered while b1 still hangs,
	// whether or not they share a call with another key of node b.
	for i := range 4 {
		done := make(chan error, 1)
		go func() {
			_, err := b.do(t.Context(), fmt.Sprintf("a%d", 3+i), false)
			done <- err
		}()
		if i%2 == 1 {
			go func() { _, _ = b.do(t.Context(), fmt.Sprintf("b%d", 2+i), false) }()
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("a%d: %v", 3+i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("a%d of a healthy node waited for the hanging node b", 3+i)
		}
	}
	if !b.trouble.has("b") {
		t.Error("node b, slow to answer, is not in trouble")
	}
}

// A hedged call over several nodes that stays out after every node has
// answered its part again (its connection gone dead, say) does not hold
// the flight: later requests are answered while it is still out.
func TestHedgedCallOutLivesItsParts(t *testing.T) {
	unhang := make(chan struct{})
	var calls atomic.Int32
	send := func(ctx context.Context, keys []string) ([]string, error) {
		if calls.Add(1) == 1 {
			select { // the first call, over both nodes, hangs
			case <-ctx.Done():
			case <-unhang:
			}
			return nil, fmt.Errorf("%w: dead connection", ErrStoreUnavailable)
		}
		return keys, nil
	}
	b := newBatcher("test", 20*time.Second, func(k string) string { return k }, send)
	b.route = func(_ context.Context, k string) string { return k[:1] }
	b.trouble = &nodeTrouble{}
	b.hedge = true
	b.maxFlights = 1
	t.Cleanup(b.wait)
	t.Cleanup(func() { close(unhang) })

	res, errs := b.doAll(t.Context(), []string{"a1", "b1"}, false)
	if errs[0] != nil || errs[1] != nil || res[0] != "a1" || res[1] != "b1" {
		t.Fatalf("a1, b1: %v %v; want both answered by their nodes' own calls", res, errs)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.do(t.Context(), "a2", false)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a2: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a2 waited for the first call of an earlier batch, still out")
	}
}
