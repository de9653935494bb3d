package idempotency

import (
	"context"
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
