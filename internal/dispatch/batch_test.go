package dispatch_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// runSource hands one run to Runner.ProcessBatch and reports what
// Runner.Batching said.
type runSource struct {
	run      []consumer.Delivery
	batching chan bool
}

func (s *runSource) Consume(ctx context.Context, r consumer.Runner) error {
	s.batching <- r.Batching()
	r.Prepare(ctx, s.run)
	r.ProcessBatch(context.WithoutCancel(ctx), s.run)
	<-ctx.Done()
	return nil
}

func runOnce(t *testing.T, h consumer.Handler, ds ...*delivery) bool {
	t.Helper()
	run := make([]consumer.Delivery, len(ds))
	for i, d := range ds {
		run[i] = d
	}
	src := &runSource{run: run, batching: make(chan bool, 1)}
	w := dispatch.NewWorker(dispatch.Config{})
	if err := w.Handle("h", src, h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := start(ctx, w)
	batching := <-src.batching
	for _, d := range ds {
		wait(t, d.done, "settlement of "+string(d.msg.Payload))
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return batching
}

func TestDirectBatchSettlesEachMessage(t *testing.T) {
	var calls [][]string
	h := consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
		var call []string
		for i, m := range msgs {
			p := string(m.Payload)
			call = append(call, p)
			switch p {
			case "flaky":
				results[i].Err = errors.New("try again")
			case "poison":
				results[i].Err = dispatch.Permanent(errors.New("bad"))
			}
		}
		calls = append(calls, call)
	})
	ok, flaky, poison, last := newDelivery("ok"), newDelivery("flaky"), newDelivery("poison"), newDelivery("last")
	if !runOnce(t, h, ok, flaky, poison, last) {
		t.Fatal("Runner.Batching is false for a BatchHandler without middleware")
	}
	if want := [][]string{{"ok", "flaky", "poison", "last"}}; !slices.EqualFunc(calls, want, slices.Equal[[]string]) {
		t.Fatalf("calls %v, want the run in one call %v", calls, want)
	}
	if !ok.acked || !last.acked || flaky.acked || len(flaky.naks) != 1 || !poison.acked || len(poison.dead) != 1 {
		t.Fatalf("ok %v last %v flaky acked %v naks %v poison acked %v dead %v: each message settles from its own result",
			ok.acked, last.acked, flaky.acked, flaky.naks, poison.acked, poison.dead)
	}
}

func TestDirectBatchPanicFailsEveryMessage(t *testing.T) {
	h := consumer.BatchFunc(func(context.Context, []*consumer.Message, []consumer.Result) { panic("boom") })
	a, b := newDelivery("a"), newDelivery("b")
	runOnce(t, h, a, b)
	for _, d := range []*delivery{a, b} {
		if d.acked || len(d.naks) != 1 {
			t.Fatalf("%s acked %v naks %v: a panic retries every message of the call", d.msg.Payload, d.acked, d.naks)
		}
	}
}

func TestPlainHandlerGetsARunInOrder(t *testing.T) {
	var (
		mu    sync.Mutex
		order []string
	)
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		mu.Lock()
		order = append(order, string(m.Payload))
		mu.Unlock()
		return nil, nil
	})
	ds := []*delivery{newDelivery("1"), newDelivery("2"), newDelivery("3")}
	if runOnce(t, h, ds...) {
		t.Fatal("Runner.Batching is true for a plain Handler")
	}
	if got := strings.Join(order, ","); got != "1,2,3" {
		t.Fatalf("order %s, want 1,2,3", got)
	}
}
