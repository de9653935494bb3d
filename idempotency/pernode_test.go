package idempotency_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/idempotency/memstore"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// nodeStore is a memstore split over two nodes as a Redis Cluster splits
// keys over its primaries: keys whose name starts with "b" live on node
// "b", the others on node "a". Node b can be made to fail its keys, or to
// hang until the call's context ends; a batch that spans both nodes then
// reports each key's own result in an idempotency.BatchError, after both
// nodes answered, as the Redis store does.
type nodeStore struct {
	*memstore.Store
	multi bool // reported by MultiNode: whether the engine may batch per node

	mu   sync.Mutex
	mode string // node b: "" healthy, "fail", "hang"
	// unhang ends the hang of node b's calls, which then fail.
	unhang chan struct{}
	// bFails counts node b's calls failed in mode "fail".
	bFails atomic.Int32
}

func (s *nodeStore) MultiNode() bool { return s.multi }

func (s *nodeStore) Node(_ context.Context, key string) string {
	if _, k, _ := strings.Cut(key, ":"); strings.HasPrefix(k, "b") {
		return "b"
	}
	return "a"
}

func (s *nodeStore) setMode(m string) {
	s.mu.Lock()
	s.mode = m
	s.mu.Unlock()
}

// nodeB fails the call of node b's keys as its mode says: nil when healthy,
// else the error its keys get, after waiting out ctx when it hangs.
func (s *nodeStore) nodeB(ctx context.Context) error {
	s.mu.Lock()
	mode := s.mode
	s.mu.Unlock()
	switch mode {
	case "fail":
		s.bFails.Add(1)
		return &idempotency.NodeError{Node: "b", Err: fmt.Errorf("%w: node b is down", idempotency.ErrStoreUnavailable)}
	case "hang":
		select {
		case <-ctx.Done():
		case <-s.unhang:
		}
		return &idempotency.NodeError{Node: "b", Err: fmt.Errorf("%w: node b: %w", idempotency.ErrStoreUnavailable, ctx.Err())}
	}
	return nil
}

func (s *nodeStore) Claim(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, error) {
	return splitCall(ctx, s, reqs, func(r idempotency.ClaimRequest) string { return r.Key }, s.Store.Claim)
}

// splitCall is a batch call of the nodeStore: node b's keys fail as its
// mode says, and the others go to the memstore in one call.
func splitCall[Req, Res any](ctx context.Context, s *nodeStore, reqs []Req, key func(Req) string, call func(context.Context, []Req) ([]Res, error)) ([]Res, error) {
	var bErr error
	errs := make([]error, len(reqs))
	var ok []Req
	var okIdx []int
	for i, r := range reqs {
		if s.Node(ctx, key(r)) == "b" {
			if bErr == nil {
				bErr = s.nodeB(ctx)
			}
			if bErr != nil {
				errs[i] = bErr
				continue
			}
		}
		ok, okIdx = append(ok, r), append(okIdx, i)
	}
	res := make([]Res, len(reqs))
	if len(ok) > 0 {
		got, err := call(ctx, ok)
		if err != nil {
			return nil, err
		}
		for j, i := range okIdx {
			res[i] = got[j]
		}
	}
	if bErr != nil {
		return res, &idempotency.BatchError{Errs: errs}
	}
	return res, nil
}

// waitAll fails t unless every delivery of ds was settled as want within d.
func waitAll(t *testing.T, d time.Duration, what string, ds []*consumertest.Delivery, want consumertest.Settlement) {
	t.Helper()
	testenv.Eventually(t, d, what, func() bool {
		for _, dl := range ds {
			if s, _ := dl.Settled(); s != want {
				return false
			}
		}
		return true
	})
}

func newNodeEngine(t *testing.T, s *nodeStore) consumer.Processor {
	t.Helper()
	eng, err := idempotency.New(s, idempotency.Config{StoreTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	dedup, err := eng.Processor()
	if err != nil {
		t.Fatal(err)
	}
	return dedup("orders", &countingHandler{})
}

// deliveries returns a delivery of each key.
func deliveries(keys ...string) ([]consumer.Delivery, map[string]*consumertest.Delivery) {
	var ds []consumer.Delivery
	by := map[string]*consumertest.Delivery{}
	for _, k := range keys {
		d := consumertest.NewDelivery(consumertest.NewMessage(k, "x"), 1)
		ds = append(ds, d)
		by[k] = d
	}
	return ds, by
}

// processAll prepares ds as one fetch and processes each delivery on its own
// goroutine, as a source with a slot per delivery does.
func processAll(t *testing.T, p consumer.Processor, ds []consumer.Delivery) {
	p.Prepare(t.Context(), ds)
	for _, d := range ds {
		testenv.Go(t, func(ctx context.Context) error {
			p.Process(ctx, d)
			return nil
		})
	}
}

// A batch claim that one node fails runs the keys of the other node; the
// failed node's keys fail closed (nakked as a store error) and run once it
// answers again.
func TestNodeFailureFailsOnlyItsKeys(t *testing.T) {
	t.Parallel()
	// Not MultiNode: the engine sends the fetch's keys in one call, and the
	// store's BatchError alone tells the keys apart.
	s := &nodeStore{Store: memstore.New(memstore.Options{})}
	s.setMode("fail")
	p := newNodeEngine(t, s)
	ds, by := deliveries("a1", "a2", "b1", "a3", "b2")
	processAll(t, p, ds)
	waitAll(t, 10*time.Second, "node a's deliveries acked", []*consumertest.Delivery{by["a1"], by["a2"], by["a3"]}, consumertest.Acked)
	waitAll(t, 10*time.Second, "node b's deliveries nakked", []*consumertest.Delivery{by["b1"], by["b2"]}, consumertest.Nakked)

	s.setMode("")
	again, byAgain := deliveries("b1", "b2")
	processAll(t, p, again)
	waitAll(t, 10*time.Second, "node b's deliveries acked once it answers", []*consumertest.Delivery{byAgain["b1"], byAgain["b2"]}, consumertest.Acked)
}

// A node that hangs until the store timeout holds back only its own keys:
// the other node's keys of the same fetch run and are acked while it
// hangs.
func TestHangingNodeHoldsBackOnlyItsKeys(t *testing.T) {
	t.Parallel()
	s := &nodeStore{Store: memstore.New(memstore.Options{}), multi: true, unhang: make(chan struct{})}
	s.setMode("hang")
	p := newNodeEngine(t, s)
	ds, by := deliveries("a1", "b1", "a2", "a3", "b2")
	processAll(t, p, ds)
	// Well within the store timeout (20s) that ends node b's hang.
	waitAll(t, 5*time.Second, "node a's deliveries acked while node b hangs", []*consumertest.Delivery{by["a1"], by["a2"], by["a3"]}, consumertest.Acked)
	for _, k := range []string{"b1", "b2"} {
		if st, _ := by[k].Settled(); st != consumertest.Unsettled {
			t.Fatalf("delivery %s on the hanging node settled %s before its node answered", k, st)
		}
	}
	// More keys of node a, while b still hangs: their claims go on.
	more, byMore := deliveries("a4", "a5")
	processAll(t, p, more)
	waitAll(t, 5*time.Second, "node a's later deliveries acked while node b hangs", []*consumertest.Delivery{byMore["a4"], byMore["a5"]}, consumertest.Acked)
	close(s.unhang)
	waitAll(t, 10*time.Second, "node b's deliveries nakked once its calls fail", []*consumertest.Delivery{by["b1"], by["b2"]}, consumertest.Nakked)
}

func (s *nodeStore) Complete(ctx context.Context, cs []idempotency.Completion) ([]bool, error) {
	return splitCall(ctx, s, cs, func(c idempotency.Completion) string { return c.Key }, s.Store.Complete)
}

// Once a node failed a completion, its completions go apart: while it
// hangs, the completions held for it are retried in its own calls, and the
// other node's completions are stored and acked.
func TestCompletionsOfAHangingNodeGoApart(t *testing.T) {
	t.Parallel()
	s := &nodeStore{Store: memstore.New(memstore.Options{}), multi: true, unhang: make(chan struct{})}
	eng, err := idempotency.New(s, idempotency.Config{StoreTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	dedup, err := eng.Processor()
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var waiting atomic.Int32
	p := dedup("orders", &countingHandler{fn: func(_ context.Context, m *consumer.Message) ([]byte, error) {
		if strings.HasPrefix(m.Header.Get("Idempotency-Key"), "b") {
			waiting.Add(1)
			<-gate
		}
		return nil, nil
	}})
	held, byHeld := deliveries("b1", "b2")
	processAll(t, p, held)
	testenv.Eventually(t, 10*time.Second, "node b's handlers running", func() bool { return waiting.Load() == 2 })
	// Their completions fail, then hang.
	s.setMode("fail")
	close(gate)
	testenv.Eventually(t, 10*time.Second, "a completion call of node b failed", func() bool { return s.bFails.Load() > 0 })
	s.setMode("hang")
	ds, by := deliveries("a1", "a2", "a3")
	processAll(t, p, ds)
	waitAll(t, 5*time.Second, "node a's deliveries acked while node b's completions hang", []*consumertest.Delivery{by["a1"], by["a2"], by["a3"]}, consumertest.Acked)
	s.setMode("")
	close(s.unhang)
	waitAll(t, 15*time.Second, "node b's held completions stored once it answers", []*consumertest.Delivery{byHeld["b1"], byHeld["b2"]}, consumertest.Acked)
}
