package ctxshare

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Deadlines hands out contexts that end between D and D+D/8 from now, one
// shared by every call made within D/8, so a call allocates no context and
// starts no timer of its own. A context is never cancelled before its
// deadline, and carries no values. The zero value is not usable: set D. It
// is safe for concurrent use.
type Deadlines struct {
	// D is the least time a context handed out has left.
	D time.Duration

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

// Ctx returns a context without values that ends between D and D+D/8 from
// now.
func (s *Deadlines) Ctx() context.Context {
	now := time.Now()
	if c := s.cur.Load(); c != nil && c.at.Sub(now) >= s.D {
		return c.ctx
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.cur.Load(); c != nil && c.at.Sub(now) >= s.D {
		return c.ctx
	}
	at := now.Add(s.D + s.D/8)
	ctx, cancel := context.WithDeadline(context.Background(), at)
	s.cur.Store(&deadline{ctx: ctx, at: at, cancel: cancel})
	return ctx
}
