package ctxshare

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
)

// MaxShared bounds how many live cancellable source contexts a Binder
// shares; past it, Bind binds per call.
const MaxShared = 1024

// Binder binds the contexts a source passes with each delivery to the
// worker's hard-stop context: the result ends, with the work context's
// cause, when either does. The zero value is ready to use; every call on
// one Binder must pass the same work context. It is safe for concurrent use.
//
// A context nothing cancels (context.WithoutCancel, as the NATS source
// passes for every delivery) is bound once, into a context with its values
// and the work context's cancellation, and shared by every delivery that
// passes the same context. A context a source may cancel (a Kafka
// partition's, cancelled on revocation) is bound once while it lives, then
// forgotten. Other contexts, and any past MaxShared live ones, are bound
// per call. BenchmarkBind guards what sharing saves.
type Binder struct {
	bound atomic.Pointer[boundCtx]

	mu     sync.Mutex
	shared map[context.Context]context.Context
}

// Bind returns ctx also cancelled, with work's cause, when work is. The
// caller calls the CancelFunc once it is done with the context; for a
// shared context it does nothing.
func (b *Binder) Bind(ctx, work context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() == nil {
		if c := b.bound.Load(); c != nil && c.src == ctx && c.work == work {
			return c, nop
		}
		// Through a WithValue, lookups in ctx do not allocate: a Value
		// method called directly on a context.WithoutCancel converts it to
		// an interface (the context package's own walk does not).
		c := &boundCtx{Context: context.WithValue(ctx, boundKey{}, nil), src: ctx, work: work}
		b.bound.Store(c)
		return c, nop
	}
	if c := b.share(ctx, work); c != nil {
		return c, nop
	}
	c, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(work, func() { cancel(context.Cause(work)) })
	return c, func() { stop(); cancel(nil) }
}

// share binds ctx once for every call that passes it, for as long as it
// lives: the shared context ends when ctx or work does, and is then
// forgotten. It returns nil for a context that cannot be a map key (only
// pointer types are shared) or when MaxShared contexts are live (a source
// passing a new context per delivery): the caller binds per call.
func (b *Binder) share(ctx, work context.Context) context.Context {
	if reflect.TypeOf(ctx).Kind() != reflect.Pointer {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.shared[ctx]; ok {
		return c
	}
	if len(b.shared) >= MaxShared {
		return nil
	}
	c, cancel := context.WithCancelCause(ctx)
	stopWork := context.AfterFunc(work, func() { cancel(context.Cause(work)) })
	if b.shared == nil {
		b.shared = make(map[context.Context]context.Context)
	}
	b.shared[ctx] = c
	context.AfterFunc(c, func() {
		stopWork()
		b.mu.Lock()
		delete(b.shared, ctx)
		b.mu.Unlock()
	})
	return c
}

// live returns how many shared contexts are live.
func (b *Binder) live() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.shared)
}

func nop() {}

// boundCtx has the values of a context that is never cancelled, and the
// cancellation, deadline and cause of the work context.
type boundCtx struct {
	context.Context // src's values; never cancelled (Done is nil)
	src             context.Context
	work            context.Context
}

type boundKey struct{}

func (c *boundCtx) Deadline() (time.Time, bool) { return c.work.Deadline() }
func (c *boundCtx) Done() <-chan struct{}       { return c.work.Done() }
func (c *boundCtx) Err() error                  { return c.work.Err() }

// Value looks in the source's context first. It hides the cancellation of
// whatever it was derived from (Done is nil), so context.Cause and derived
// contexts find the work context's cancellation in work.
func (c *boundCtx) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.work.Value(key)
}

func (c *boundCtx) String() string { return "ctxshare.bound(" + fmt.Sprint(c.src) + ")" }
