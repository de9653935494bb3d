package consumer

import (
	"context"
	"errors"
)

// Middleware wraps a Handler with a cross-cutting concern: logging, metrics
// or tracing of the handler's own work. It returns the handler to call
// instead of next. Middleware runs inside the Processor, once per handler
// call: with deduplication, after the key is claimed, so a duplicate never
// reaches it, and the claim is in ctx (dedupworker.ClaimOf).
//
// A Worker applies Config.Middleware around every handler, then the
// handler's own WithMiddleware, each list in order: the first listed is the
// outermost, the first to see a call. Chain applies a list the same way.
//
// A Middleware keeps a BatchHandler one: when next is also a BatchHandler,
// the Handler it returns must be one too (Batched makes it from the two
// halves), or Chain and Worker.Handle fail with ErrMiddlewareDropsBatch.
// Otherwise the batch handler would silently be called one message at a
// time.
type Middleware func(next Handler) Handler

// ErrMiddlewareDropsBatch is the cause of the error Chain and Worker.Handle
// return when a Middleware wraps a BatchHandler in a Handler that is not
// one.
var ErrMiddlewareDropsBatch = errors.New("dedup: middleware drops the BatchHandler")

// Batched returns a Handler whose Handle is h's and that is also a
// BatchHandler whose HandleBatch is b's: what a Middleware returns when the
// handler it wraps is a BatchHandler, so that runs reach b.
func Batched(h Handler, b BatchHandler) Handler { return batched{h: h, b: b} }

type batched struct {
	h Handler
	b BatchHandler
}

func (x batched) Handle(ctx context.Context, m *Message) ([]byte, error) { return x.h.Handle(ctx, m) }

func (x batched) HandleBatch(ctx context.Context, msgs []*Message, results []Result) {
	x.b.HandleBatch(ctx, msgs, results)
}
