// Package ctxshare makes the contexts that every delivery needs without a
// context, a timer or an AfterFunc registration per delivery, by sharing
// one between the deliveries that can use the same:
//
//   - Deadlines hands out deadline contexts shared by every call made
//     within an eighth of the timeout (the engine's completions and acks);
//   - WithValues joins one context's values to another's deadline and
//     cancellation (an ack that must outlive its delivery's cancellation but
//     keep its values, such as the trace span);
//   - Binder binds a source's delivery context to the worker's hard-stop
//     context once for every delivery that passes it (dispatch.Worker);
//   - Carrier carries one value inside a struct that is allocated anyway (the
//     engine's state of one handler run).
//
// These are the only custom context.Context implementations of the module.
// The code they replace is a context.WithTimeout or WithCancelCause and
// AfterFunc per call; BenchmarkEngine (idempotency, allocs/op) and
// BenchmarkBind here guard the difference, and docs/PERFORMANCE.md has the
// figures.
package ctxshare
