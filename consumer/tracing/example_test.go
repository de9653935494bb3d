package tracing_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/dedupworker"
	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/consumer/tracing"
	"github.com/idemkit/dedupworker/idempotency/memstore"
)

// A span per delivery, continuing the message's traceparent and carrying
// its outcome: the redelivery gets a span too, with the duplicate outcome,
// though its handler never runs. An in-memory exporter stands in for OTLP.
func ExampleTracer_Wrap() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	tr := tracing.New(tp)

	first := consumertest.NewMessage("order-1", `{"sku":"A"}`)
	first.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	src := consumertest.NewSource(first, consumertest.NewMessage("order-1", `{"sku":"A"}`))
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{
		Wrap: []consumer.ProcessorWrapper{tr.Wrap},
	})
	if err != nil {
		panic(err)
	}
	err = w.Handle("orders", src, dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
		// The handler runs inside the delivery's span: what it sends on
		// can carry the trace (tr.Propagator().Inject).
		fmt.Println("handler in trace", trace.SpanContextFromContext(ctx).TraceID())
		return nil, nil
	}))
	if err != nil {
		panic(err)
	}
	if err := w.Run(context.Background()); err != nil {
		panic(err)
	}
	for _, s := range exp.GetSpans() {
		for _, kv := range s.Attributes {
			if kv.Key == tracing.AttrOutcome {
				fmt.Println(s.Name, kv.Value.AsString())
			}
		}
	}
	// Output:
	// handler in trace 4bf92f3577b34da6a3ce929d0e0e4736
	// orders process processed
	// orders process duplicate
}
