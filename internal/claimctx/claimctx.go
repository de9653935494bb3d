package claimctx

import "context"

// Key is the context key under which a [Run] is found.
type Key struct{}

// Info describes the claim a handler runs under. dedupworker.Claim has the
// same fields, in the same order, so that one converts to the other.
type Info struct {
	Handler      string
	Key          string
	EffectiveKey string
	Fence        int64
	Attempt      int
	Reclaimed    bool
}

// Run is one run of a handler under a claim, as the engine keeps it.
type Run interface {
	// Claim returns the claim of the run.
	Claim() Info
	// Step runs fn once per key across retries and crashes: a step that
	// finished in an earlier run returns its stored result.
	Step(ctx context.Context, name string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error)
}

// From returns the run ctx belongs to; ok is false outside a deduplicated
// run.
func From(ctx context.Context) (r Run, ok bool) {
	r, ok = ctx.Value(Key{}).(Run)
	return r, ok
}
