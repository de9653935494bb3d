package dispatch_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// trail records the order in which wrappers and handlers see a call.
type trail struct {
	mu    sync.Mutex
	steps []string
}

func (tr *trail) add(s string) {
	tr.mu.Lock()
	tr.steps = append(tr.steps, s)
	tr.mu.Unlock()
}

func (tr *trail) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.steps)
}

// named is a Middleware that records its name around each single call and,
// through Batched, around each batch call.
func named(tr *trail, name string) consumer.Middleware {
	return func(next consumer.Handler) consumer.Handler {
		one := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			tr.add(name)
			return next.Handle(ctx, m)
		})
		bh, ok := next.(consumer.BatchHandler)
		if !ok {
			return one
		}
		return consumer.Batched(one, consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
			tr.add(name + " batch")
			bh.HandleBatch(ctx, msgs, results)
		}))
	}
}

// The worker's middleware wraps the handler's, each list first-outermost.
func TestMiddlewareOrder(t *testing.T) {
	tr := &trail{}
	src := consumertest.NewSource(consumertest.NewMessage("k", "p"))
	w := dispatch.NewWorker(dispatch.Config{Middleware: []consumer.Middleware{named(tr, "worker1"), named(tr, "worker2")}})
	h := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) {
		tr.add("handler")
		return nil, nil
	})
	if err := w.Handle("h", src, h, dispatch.WithMiddleware(named(tr, "own1")), dispatch.WithMiddleware(named(tr, "own2"))); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{"worker1", "worker2", "own1", "own2", "handler"}
	if got := tr.get(); !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
	if st, _ := src.Deliveries()[0].Settled(); st != consumertest.Acked {
		t.Fatalf("delivery %v, want acked", st)
	}
}

// A middleware that keeps the BatchHandler (Batched) keeps the runs: the
// handler gets the run in one call, through the middleware.
func TestMiddlewareKeepsBatchHandler(t *testing.T) {
	tr := &trail{}
	var sizes []int
	h := consumer.BatchFunc(func(_ context.Context, msgs []*consumer.Message, _ []consumer.Result) {
		sizes = append(sizes, len(msgs))
	})
	wrapped, err := dispatch.Chain(h, named(tr, "a"), named(tr, "b"))
	if err != nil {
		t.Fatal(err)
	}
	ds := []*delivery{newDelivery("1"), newDelivery("2"), newDelivery("3")}
	if !runOnce(t, wrapped, ds...) {
		t.Fatal("Runner.Batching is false behind a middleware that keeps the BatchHandler")
	}
	if !slices.Equal(sizes, []int{3}) || !slices.Equal(tr.get(), []string{"a batch", "b batch"}) {
		t.Fatalf("handler calls of sizes %v through %v, want one call of 3 through a then b", sizes, tr.get())
	}
	for _, d := range ds {
		if !d.acked {
			t.Errorf("delivery %s not acked", d.msg.Payload)
		}
	}
}

// A middleware that drops the BatchHandler is refused at Handle, naming the
// middleware and the fix, instead of silently running the batch handler one
// message at a time.
func TestMiddlewareDroppingBatchHandlerIsRefused(t *testing.T) {
	plain := func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) { return next.Handle(ctx, m) })
	}
	batch := consumer.BatchFunc(func(context.Context, []*consumer.Message, []consumer.Result) {})
	w := dispatch.NewWorker(dispatch.Config{})
	err := w.Handle("h", &chanSource{}, batch, dispatch.WithMiddleware(consumer.Middleware(plain)))
	if !errors.Is(err, consumer.ErrMiddlewareDropsBatch) || !strings.Contains(err.Error(), `"h"`) ||
		!strings.Contains(err.Error(), "middleware 0") || !strings.Contains(err.Error(), "dedupworker.Batched") {
		t.Fatalf("Handle: %v; want ErrMiddlewareDropsBatch naming the handler, the middleware and dedupworker.Batched", err)
	}
	// The same middleware around a plain handler is fine.
	h := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })
	if err := w.Handle("plain", &chanSource{}, h, dispatch.WithMiddleware(plain)); err != nil {
		t.Fatalf("plain handler: %v", err)
	}
	// Worker-level middleware is checked the same way.
	w2 := dispatch.NewWorker(dispatch.Config{Middleware: []consumer.Middleware{plain}})
	if err := w2.Handle("h", &chanSource{}, batch); !errors.Is(err, consumer.ErrMiddlewareDropsBatch) {
		t.Fatalf("worker middleware: %v; want ErrMiddlewareDropsBatch", err)
	}
}

func TestHandleRejectsNilWrappers(t *testing.T) {
	h := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })
	nilResult := func(consumer.Handler) consumer.Handler { return nil }
	cases := []struct {
		name string
		cfg  dispatch.Config
		opt  dispatch.HandleOption
		want string
	}{
		{"nil middleware", dispatch.Config{}, dispatch.WithMiddleware(nil), "middleware 0 is nil"},
		{"nil handler from middleware", dispatch.Config{}, dispatch.WithMiddleware(nilResult), "middleware 0 returned a nil Handler"},
		{"nil processor", dispatch.Config{}, dispatch.WithProcessor(nil), "WithProcessor(nil)"},
		{"nil wrapper", dispatch.Config{Wrap: []consumer.ProcessorWrapper{nil}}, dispatch.WithConcurrency(1), "Config.Wrap[0] is nil"},
	}
	for _, tc := range cases {
		err := dispatch.NewWorker(tc.cfg).Handle("h", &chanSource{}, h, tc.opt)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// recorder is a ProcessorWrapper that records every Processor method it
// forwards.
type recorder struct {
	tr   *trail
	name string
	next consumer.Processor
}

func (r *recorder) Prepare(ctx context.Context, b []consumer.Delivery) {
	r.tr.add(r.name + " prepare")
	r.next.Prepare(ctx, b)
}

func (r *recorder) Process(ctx context.Context, d consumer.Delivery) {
	r.tr.add(r.name + " process")
	r.next.Process(ctx, d)
}

func (r *recorder) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	r.tr.add(r.name + " batch")
	r.next.ProcessBatch(ctx, ds)
}

func (r *recorder) Batching() bool { return r.next.Batching() }

// Config.Wrap wraps the processor, first outermost, and every method of the
// Processor reaches the processor through the wrappers; the handler's
// middleware runs inside the processor.
func TestWrapSeesEveryMethod(t *testing.T) {
	tr := &trail{}
	wrap := func(name string) consumer.ProcessorWrapper {
		return func(handler string, next consumer.Processor) consumer.Processor {
			if handler != "h" {
				t.Errorf("wrapper got handler %q", handler)
			}
			return &recorder{tr: tr, name: name, next: next}
		}
	}
	var factoryName string
	factory := func(name string, h consumer.Handler) consumer.Processor {
		factoryName = name
		return consumer.ProcessorFunc(func(ctx context.Context, d consumer.Delivery) {
			tr.add("processor")
			_, _ = h.Handle(ctx, d.Message())
			_ = d.Ack(ctx)
		})
	}
	h := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) {
		tr.add("handler")
		return nil, nil
	})
	ds := []*delivery{newDelivery("1"), newDelivery("2")}
	run := []consumer.Delivery{ds[0], ds[1]}
	src := &runSource{run: run, batching: make(chan bool, 1)}
	w := dispatch.NewWorker(dispatch.Config{Wrap: []consumer.ProcessorWrapper{wrap("outer"), wrap("inner")}})
	if err := w.Handle("h", src, h, dispatch.WithProcessor(factory), dispatch.WithMiddleware(named(tr, "mw"))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := start(ctx, w)
	if <-src.batching {
		t.Error("Batching is true for a ProcessorFunc")
	}
	for _, d := range ds {
		wait(t, d.done, "settlement of "+string(d.msg.Payload))
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	want := []string{
		"outer prepare", "inner prepare",
		"outer batch", "inner batch",
		"processor", "mw", "handler",
		"processor", "mw", "handler",
	}
	if got := tr.get(); !slices.Equal(got, want) || factoryName != "h" {
		t.Fatalf("calls %v (factory for %q), want %v (for \"h\")", got, factoryName, want)
	}
}

func TestRunRejectsNilProcessors(t *testing.T) {
	h := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })
	nilWrap := func(string, consumer.Processor) consumer.Processor { return nil }
	nilFactory := func(string, consumer.Handler) consumer.Processor { return nil }
	cases := []struct {
		name string
		cfg  dispatch.Config
		opts []dispatch.HandleOption
		want string
	}{
		{"factory", dispatch.Config{}, []dispatch.HandleOption{dispatch.WithProcessor(nilFactory)}, "WithProcessor factory returned a nil Processor"},
		{"wrapper", dispatch.Config{Wrap: []consumer.ProcessorWrapper{nilWrap}}, nil, "Config.Wrap[0] returned a nil Processor"},
	}
	for _, tc := range cases {
		w := dispatch.NewWorker(tc.cfg)
		if err := w.Handle("h", &chanSource{in: make(chan consumer.Delivery)}, h, tc.opts...); err != nil {
			t.Fatal(err)
		}
		if err := w.Run(t.Context()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Run: %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
}
