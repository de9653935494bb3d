package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// CallBatchHandler runs h on msgs, turning a panic into a *PanicError in
// every result. results must have len(msgs); it is zeroed first.
func CallBatchHandler(ctx context.Context, h consumer.BatchHandler, msgs []*consumer.Message, results []consumer.Result) {
	clear(results)
	defer func() {
		if v := recover(); v != nil {
			pe := &consumer.PanicError{Value: v, Stack: stack()}
			for i := range results {
				results[i] = consumer.Result{Err: pe}
			}
		}
	}()
	h.HandleBatch(ctx, msgs, results)
}

type batchCtxKey struct{}

// batchContexts is the value WithMessageContexts stores.
type batchContexts struct{ ctxs []context.Context }

// WithMessageContexts returns ctx carrying the per-message contexts of a
// batch call, for MessageContext. Processors that call HandleBatch use it;
// ctxs[i] belongs to the i-th message and must not outlive the call.
func WithMessageContexts(ctx context.Context, ctxs []context.Context) context.Context {
	return context.WithValue(ctx, batchCtxKey{}, &batchContexts{ctxs: ctxs})
}

// MessageContext returns the context of the i-th message of a batch call
// (see BatchHandler): it carries that message's claim and ends when the
// claim is lost, as well as when ctx ends. Outside a batch call, or for an
// index the call does not have, it returns ctx.
func MessageContext(ctx context.Context, i int) context.Context {
	b, ok := ctx.Value(batchCtxKey{}).(*batchContexts)
	if !ok || i < 0 || i >= len(b.ctxs) || b.ctxs[i] == nil {
		return ctx
	}
	return b.ctxs[i]
}

// RunHandled notifies run's source that the handlers of run are done, when
// run's first delivery is a RunHandledNotifier; otherwise it does nothing.
// A Processor calls it from ProcessBatch, with the run ProcessBatch was
// given, under the conditions RunHandledNotifier describes.
func RunHandled(run []consumer.Delivery) {
	if len(run) == 0 {
		return
	}
	if n, ok := run[0].(consumer.RunHandledNotifier); ok {
		n.RunHandled()
	}
}

// RetryDelay reports the delay requested by a RetryError in err's chain.
func RetryDelay(err error) (time.Duration, bool) {
	var r *consumer.RetryError
	if errors.As(err, &r) {
		return r.Delay, true
	}
	return 0, false
}

// CallHandler runs h, turning a panic into a *PanicError.
func CallHandler(ctx context.Context, h consumer.Handler, m *consumer.Message) (result []byte, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &consumer.PanicError{Value: v, Stack: stack()}
			result = nil
		}
	}()
	return h.Handle(ctx, m)
}

// IsPermanent reports whether err is or wraps a PermanentError.
func IsPermanent(err error) bool {
	var p *consumer.PermanentError
	return errors.As(err, &p)
}

// Chain returns h wrapped in mws, mws[0] outermost, as a Worker wraps a
// handler. It fails when a middleware is nil, returns nil, or drops a
// BatchHandler (ErrMiddlewareDropsBatch).
func Chain(h consumer.Handler, mws ...consumer.Middleware) (consumer.Handler, error) {
	for i := len(mws) - 1; i >= 0; i-- {
		if mws[i] == nil {
			return nil, fmt.Errorf("dedup: middleware %d is nil", i)
		}
		_, batch := h.(consumer.BatchHandler)
		h = mws[i](h)
		if h == nil {
			return nil, fmt.Errorf("dedup: middleware %d returned a nil Handler", i)
		}
		if _, ok := h.(consumer.BatchHandler); batch && !ok {
			return nil, fmt.Errorf("%w: middleware %d wraps a BatchHandler in a %T: return dedupworker.Batched(handler, batchHandler) from it", consumer.ErrMiddlewareDropsBatch, i, h)
		}
	}
	return h, nil
}

// Permanent wraps err so that the message is dead-lettered without further
// attempts. Permanent(nil) is still a permanent failure.
func Permanent(err error) error { return &consumer.PermanentError{Err: err} }

// RetryAfter asks for the message to be retried after d instead of the
// configured backoff, carrying err for logs and dead-letter headers. A
// negative d is treated as zero.
func RetryAfter(d time.Duration, err error) error {
	return &consumer.RetryError{Delay: max(d, 0), Err: err}
}
