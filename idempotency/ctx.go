package idempotency

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// handlerRun is what one run of the handler under a claim needs besides
// its cancellable context, in one allocation: the context's value (the
// runState that FromContext and Step find) and the lease renewer.
type handlerRun struct {
	context.Context // the delivery's
	rs              runState
	renewer         renewer
	cancel          context.CancelCauseFunc // the handler context's
}

// Value returns the run's state for ctxKey, else the delivery context's
// value.
func (r *handlerRun) Value(key any) any {
	if _, ok := key.(ctxKey); ok {
		return &r.rs
	}
	return r.Context.Value(key)
}

// deadlines hands out contexts that end between d and d+d/8 from now, one
// shared by every call made within d/8, so an ack or a completion allocates
// no context and starts no timer of its own (BenchmarkEngine's allocs/op
// guards it); Acks and Naks (NATS without AckSync, Kafka) do not even look
// at their context. A context is never cancelled before its deadline.
// The zero value is not usable: set d.
type deadlines struct {
	d   time.Duration
	cur atomic.Pointer[deadline]
	mu  sync.Mutex // held while a new context is made
}

type deadline struct {
	ctx context.Context
	at  time.Time // ctx's deadline (with a monotonic reading)
	// cancel is never called: the context ends at its deadline, when its
	// timer releases it, and not before, since calls may still use it.
	cancel context.CancelFunc
}

// ctx returns a context without values that ends between d and d+d/8 from
// now.
func (s *deadlines) ctx() context.Context {
	now := time.Now()
	if c := s.cur.Load(); c != nil && c.at.Sub(now) >= s.d {
		return c.ctx
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.cur.Load(); c != nil && c.at.Sub(now) >= s.d {
		return c.ctx
	}
	at := now.Add(s.d + s.d/8)
	ctx, cancel := context.WithDeadline(context.Background(), at)
	s.cur.Store(&deadline{ctx: ctx, at: at, cancel: cancel})
	return ctx
}

// valuesCtx has the values of one context and the deadline and
// cancellation of another.
type valuesCtx struct {
	context.Context                 // deadline, cancellation and its cause
	values          context.Context // values; its Done must be nil (context.WithoutCancel)
}

// Value looks in values first. Having no cancellation of its own to show
// (WithoutCancel hides it), values lets context.Cause and derived contexts
// find the deadline context's.
func (c *valuesCtx) Value(key any) any {
	if v := c.values.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}
