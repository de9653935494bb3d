package ctxshare

import "context"

// WithValues returns a context with the deadline, cancellation and cause of
// deadline and the values of values, looked up in values first. values'
// own cancellation is hidden: a context derived from the result ends with
// deadline only. With a shared deadline (Deadlines) it starts no timer,
// where context.WithTimeout(context.WithoutCancel(values), d) starts one a
// call.
func WithValues(deadline, values context.Context) context.Context {
	if values.Done() != nil {
		// Hide its cancellation (a context that can never be cancelled,
		// as the sources' shared delivery context, has none to hide).
		values = context.WithoutCancel(values)
	}
	return &valuesCtx{Context: deadline, values: values}
}

// valuesCtx has the values of one context and the deadline and
// cancellation of another.
type valuesCtx struct {
	context.Context                 // deadline, cancellation and its cause
	values          context.Context // values; its Done is nil
}

// Value looks in values first. Having no cancellation of its own to show
// (its Done is nil), values lets context.Cause and derived contexts find
// the deadline context's.
func (c *valuesCtx) Value(key any) any {
	if v := c.values.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}

// String names the context as the context package's own do.
func (c *valuesCtx) String() string { return "ctxshare.WithValues" }
