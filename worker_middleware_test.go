package dedupworker_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/idemkit/dedupworker"
	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency/memstore"
)

// Middleware runs inside the engine, after the claim: the worker's first,
// then the handler's, and not at all for a duplicate. Config.Wrap sees every
// delivery, the duplicate included. The test's source runs one delivery at a
// time, so the slice needs no lock.
func TestMiddlewareAndWrap(t *testing.T) {
	var calls []string
	mw := func(name string) dedupworker.Middleware {
		return func(next dedupworker.Handler) dedupworker.Handler {
			return dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
				if _, ok := dedupworker.ClaimOf(ctx); !ok {
					t.Errorf("middleware %s runs without the claim in its context", name)
				}
				calls = append(calls, name)
				return next.Handle(ctx, m)
			})
		}
	}
	wrap := func(_ string, next consumer.Processor) consumer.Processor {
		return &processSpy{Processor: next, calls: &calls}
	}
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{
		Middleware: []dedupworker.Middleware{mw("worker")},
		Wrap:       []consumer.ProcessorWrapper{wrap},
	})
	if err != nil {
		t.Fatal(err)
	}
	src := consumertest.NewSource(consumertest.NewMessage("k", "p"), consumertest.NewMessage("k", "p"))
	h := dedupworker.HandlerFunc(func(context.Context, *dedupworker.Message) ([]byte, error) {
		calls = append(calls, "handler")
		return nil, nil
	})
	if err := w.Handle("h", src, h, dedupworker.WithMiddleware(mw("own"))); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{"wrap", "worker", "own", "handler", "wrap"}
	if !slices.Equal(calls, want) {
		t.Fatalf("calls %v, want %v: the duplicate reaches the wrapper, not the middleware", calls, want)
	}
}

// A middleware that drops a batch handler is refused with the engine too.
func TestMiddlewareDroppingBatchRefused(t *testing.T) {
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	plain := func(next dedupworker.Handler) dedupworker.Handler {
		return dedupworker.HandlerFunc(next.Handle)
	}
	batch := consumer.BatchFunc(func(context.Context, []*consumer.Message, []consumer.Result) {})
	err = w.Handle("h", consumertest.NewSource(), batch, dedupworker.WithMiddleware(plain))
	if !errors.Is(err, consumer.ErrMiddlewareDropsBatch) {
		t.Fatalf("Handle: %v; want ErrMiddlewareDropsBatch", err)
	}
}

// processSpy records each delivery it processes; Prepare and Batching are
// its Processor's.
type processSpy struct {
	consumer.Processor
	calls *[]string
}

func (p *processSpy) Process(ctx context.Context, d consumer.Delivery) {
	*p.calls = append(*p.calls, "wrap")
	p.Processor.Process(ctx, d)
}

func (p *processSpy) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	for range ds {
		*p.calls = append(*p.calls, "wrap")
	}
	p.Processor.ProcessBatch(ctx, ds)
}
