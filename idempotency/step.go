package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// ClaimInfo describes the claim a handler runs under.
type ClaimInfo struct {
	// Handler is the scope.
	Handler string
	// Key is the raw idempotency key.
	Key string
	// EffectiveKey is "<scope>:<key>" as stored (without the namespace).
	EffectiveKey string
	// Fence grows with every new owner of the key, also after its record
	// was lost (expired, deleted, a wiped Redis): pass it to downstream
	// systems so they can reject a stale writer, one whose fence is lower
	// than the highest they have seen for the key. See Record.Fence for
	// what it rests on.
	Fence int64
	// Attempt is the 1-based run of the handler for this key.
	Attempt int
	// Reclaimed is true when this run took over an expired lease of a worker
	// that crashed or stalled: its side effects may be partly done.
	Reclaimed bool
}

type ctxKey struct{}

// runState is what the context carries for a handler run.
type runState struct {
	info  ClaimInfo
	store Store
	token string

	mu    sync.Mutex
	steps map[string][]byte
}

// FromContext returns the claim the handler runs under. ok is false outside
// a deduplicated run (passthrough, shadow-mode duplicates, fail-open).
func FromContext(ctx context.Context) (ClaimInfo, bool) {
	rs, ok := ctx.Value(ctxKey{}).(*runState)
	if !ok {
		return ClaimInfo{}, false
	}
	return rs.info, true
}

// stepSaveTimeout bounds one SaveStep call.
const stepSaveTimeout = 5 * time.Second

// Step runs fn once per key across retries and crashes (SPEC §5.4): when the
// key's handler runs again, a step that finished before returns its stored
// result without calling fn. Each finished step's result is stored, fenced by
// the claim's token, before Step returns, so a repeat of a side effect is
// limited to a crash inside that step. Name steps uniquely within a handler.
//
// Outside a deduplicated run Step just calls fn. If the claim was lost, Step
// returns an error wrapping ErrLeaseLost; if the result cannot be stored, an
// error wrapping ErrStoreUnavailable (the step will run again on retry).
func Step(ctx context.Context, name string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	rs, ok := ctx.Value(ctxKey{}).(*runState)
	if !ok {
		return fn(ctx)
	}
	rs.mu.Lock()
	res, done := rs.steps[name]
	rs.mu.Unlock()
	if done {
		return res, nil
	}
	res, err := fn(ctx)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepSaveTimeout)
	defer cancel()
	saved, err := rs.store.SaveStep(sctx, rs.info.EffectiveKey, rs.token, name, res)
	if err != nil {
		return res, fmt.Errorf("dedup: step %q ran but its result was not stored: %w", name, err)
	}
	if !saved {
		return res, fmt.Errorf("dedup: step %q: %w", name, ErrLeaseLost)
	}
	rs.mu.Lock()
	if rs.steps == nil {
		rs.steps = make(map[string][]byte)
	}
	rs.steps[name] = res
	rs.mu.Unlock()
	return res, nil
}
