// Package tracing continues W3C trace context through dedupworker. It is for
// library users who trace their handlers with OpenTelemetry: each delivery
// gets a span, a child of the message's traceparent header, carrying the
// outcome, a hash of the key (never the key) and the fence. The handler runs
// inside it, so what it sends onward can carry the trace ([Tracer.Propagator],
// [HeaderCarrier]).
//
// Make a [Tracer] over any OpenTelemetry TracerProvider and wrap every
// handler's Processor with it:
//
//	tr := tracing.New(otel.GetTracerProvider())
//	w, err := dedupworker.NewWorker(store, dedupworker.Config{Wrap: []dedupworker.Wrapper{tr.Wrap}})
//
// The span wraps the Processor, not the Handler, because the outcome it
// records (duplicate, dead-lettered, ...) is decided there, and a duplicate
// never reaches the handler.
//
// The package needs only the OpenTelemetry API: the program that uses it
// sets up the SDK and its exporter (the dedupworker binary does, from the
// OTEL_* environment).
package tracing
