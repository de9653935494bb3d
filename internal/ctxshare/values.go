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

// Carrier is a context with one value of type V under a key of type K (an
// unexported struct{} type, as context keys are), to embed in a struct the
// caller allocates anyway: context.WithValue(parent, K{}, &v) makes an
// allocation of its own per call. Bind sets its parent; Value answers a key
// of type K with a pointer to Val, and every other key from the parent.
// Deadline, Done, Err and the cause are the parent's.
type Carrier[K comparable, V any] struct {
	context.Context // the parent
	Val             V
}

// Bind makes parent c's parent. It is called once, before c is used as a
// context.
func (c *Carrier[K, V]) Bind(parent context.Context) { c.Context = parent }

// Value returns &c.Val for a key of type K, else the parent's value.
func (c *Carrier[K, V]) Value(key any) any {
	if _, ok := key.(K); ok {
		return &c.Val
	}
	return c.Context.Value(key)
}

// String names the context as the context package's own do.
func (c *Carrier[K, V]) String() string { return "ctxshare.Carrier" }
