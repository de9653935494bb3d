package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// observed wraps a Store, timing every call for HookStoreCall
// (dedup_store_duration_seconds, dedup_store_errors_total).
type observed struct {
	s     Store
	hooks consumer.Hooks
}

func (o observed) done(op string, start time.Time, err error) {
	o.hooks.StoreCall(op, time.Since(start), err)
}

func (o observed) Claim(ctx context.Context, reqs []ClaimRequest) (r []ClaimResult, err error) {
	defer func(start time.Time) { o.done("claim", start, err) }(time.Now())
	return o.s.Claim(ctx, reqs)
}

func (o observed) Complete(ctx context.Context, cs []Completion) (ok []bool, err error) {
	defer func(start time.Time) { o.done("complete", start, err) }(time.Now())
	return o.s.Complete(ctx, cs)
}

func (o observed) Renew(ctx context.Context, key, token string, lease time.Duration) (until time.Time, ok bool, err error) {
	defer func(start time.Time) { o.done("renew", start, err) }(time.Now())
	return o.s.Renew(ctx, key, token, lease)
}

func (o observed) Release(ctx context.Context, key, token string, keep time.Duration) (ok bool, err error) {
	defer func(start time.Time) { o.done("release", start, err) }(time.Now())
	return o.s.Release(ctx, key, token, keep)
}

func (o observed) SaveStep(ctx context.Context, key, token, step string, result []byte) (ok bool, err error) {
	defer func(start time.Time) { o.done("step", start, err) }(time.Now())
	return o.s.SaveStep(ctx, key, token, step, result)
}

func (o observed) Wait(ctx context.Context, key string, max time.Duration) (r *Record, err error) {
	defer func(start time.Time) { o.done("inflight", start, err) }(time.Now())
	return o.s.Wait(ctx, key, max)
}

func (o observed) Get(ctx context.Context, key string) (r *Record, err error) {
	defer func(start time.Time) { o.done("get", start, err) }(time.Now())
	return o.s.Get(ctx, key)
}

func (o observed) Delete(ctx context.Context, key string) (existed bool, err error) {
	defer func(start time.Time) { o.done("delete", start, err) }(time.Now())
	return o.s.Delete(ctx, key)
}

func (o observed) Ping(ctx context.Context) (err error) {
	defer func(start time.Time) { o.done("ping", start, err) }(time.Now())
	return o.s.Ping(ctx)
}
