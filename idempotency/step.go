package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/dedupworker/internal/claimctx"
)

// runState is what the context carries for a handler run.
type runState struct {
	info  claimctx.Info
	store Store
	token string

	mu    sync.Mutex
	steps map[string][]byte
}

// Claim returns the claim of the run.
func (rs *runState) Claim() claimctx.Info { return rs.info }

// stepSaveTimeout bounds one SaveStep call.
const stepSaveTimeout = 5 * time.Second

// Step runs fn once per key across retries and crashes: when the
// key's handler runs again, a step that finished before returns its stored
// result without calling fn. Each finished step's result is stored, fenced by
// the claim's token, before Step returns, so a repeat of a side effect is
// limited to a crash inside that step. Name steps uniquely within a handler.
//
// Outside a deduplicated run Step just calls fn. If the claim was lost, Step
// returns an error wrapping ErrLeaseLost; if the result cannot be stored, an
// error wrapping ErrStoreUnavailable (the step will run again on retry).
func (rs *runState) Step(ctx context.Context, name string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
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
