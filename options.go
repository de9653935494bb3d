package dedupworker

import (
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

// Option configures one handler ([Worker.Handle]).
type Option func(*handlerOptions)

type handlerOptions struct {
	concurrency *int
	middleware  []Middleware
	backoff     *[2]time.Duration
	maxAttempts *int
	dedup       []idempotency.Option // options of the deduplication alone
	dedupOnly   []string             // their names, for WithoutDedup's error
	noDedup     bool
}

// engineOptions are the options of the deduplication engine, the retry
// options among them.
func (o *handlerOptions) engineOptions() []idempotency.Option {
	opts := o.dedup
	if o.backoff != nil {
		opts = append(opts, idempotency.WithBackoff(o.backoff[0], o.backoff[1]))
	}
	if o.maxAttempts != nil {
		opts = append(opts, idempotency.WithMaxAttempts(*o.maxAttempts))
	}
	return opts
}

func dedupOption(name string, opt idempotency.Option) Option {
	return func(o *handlerOptions) {
		o.dedup = append(o.dedup, opt)
		o.dedupOnly = append(o.dedupOnly, name)
	}
}

// WithConcurrency caps how many messages of the handler run at once; a run
// of a batch handler holds one slot. Default 16.
func WithConcurrency(n int) Option { return func(o *handlerOptions) { o.concurrency = &n } }

// WithMiddleware wraps this handler in mws, inside [Config.Middleware]; the
// first listed is the outermost. Repeated, it appends.
func WithMiddleware(mws ...Middleware) Option {
	return func(o *handlerOptions) { o.middleware = append(o.middleware, mws...) }
}

// WithBackoff sets the delay before retrying a failed message: initial,
// doubling for every further attempt up to max, with jitter. Default 1s to
// 5m. It applies to handlers registered [WithoutDedup] too.
func WithBackoff(initial, max time.Duration) Option {
	return func(o *handlerOptions) { o.backoff = &[2]time.Duration{initial, max} }
}

// WithMaxAttempts sets how many runs a message gets before it is
// dead-lettered. Default 5; for a handler registered [WithoutDedup], where
// the broker's delivery count is the attempt, no limit.
func WithMaxAttempts(n int) Option { return func(o *handlerOptions) { o.maxAttempts = &n } }

// WithoutDedup runs the handler at least once, with no deduplication: acked
// on success, retried on error, dead-lettered on [Permanent] errors. Only
// [WithConcurrency], [WithMiddleware], [WithBackoff] and [WithMaxAttempts]
// go with it.
func WithoutDedup() Option { return func(o *handlerOptions) { o.noDedup = true } }

// WithKey sets where the idempotency key is read from, tried in order.
// Default: the Idempotency-Key header.
func WithKey(sources ...KeySource) Option {
	return dedupOption("WithKey", idempotency.WithKeySources(sources...))
}

// WithLease sets how long a claim is owned before another worker may take
// it over; it is renewed every third of it while the handler runs. Default
// 30s.
func WithLease(d time.Duration) Option { return dedupOption("WithLease", idempotency.WithLease(d)) }

// WithRetention sets how long a completed key is remembered: the
// deduplication window. Default 24h.
func WithRetention(d time.Duration) Option {
	return dedupOption("WithRetention", idempotency.WithRetention(d))
}

// WithMissingKey sets what happens to a message without a key:
// [MissingKeyReject] (the default) dead-letters it, [MissingKeyPassthrough]
// runs it without deduplication.
func WithMissingKey(p MissingKeyPolicy) Option {
	return dedupOption("WithMissingKey", idempotency.WithMissingKey(p))
}

// WithMismatch sets what happens to a message whose key was completed for
// other content: [MismatchReject] (the default) dead-letters it,
// [MismatchIgnore] acks it as a duplicate.
func WithMismatch(p MismatchPolicy) Option {
	return dedupOption("WithMismatch", idempotency.WithMismatch(p))
}

// WithFingerprintHeaders adds headers to the content fingerprint, beside
// the payload, that tells a reused key from a redelivery.
func WithFingerprintHeaders(names ...string) Option {
	return dedupOption("WithFingerprintHeaders", idempotency.WithFingerprintHeaders(names...))
}

// WithInFlightWait bounds how long a message waits for another worker that
// holds its key before it is redelivered later. Default: the lease.
func WithInFlightWait(d time.Duration) Option {
	return dedupOption("WithInFlightWait", idempotency.WithInFlightWait(d))
}

// WithStoreRetry sets the backoff of redeliveries while the store is
// unavailable. Default 500ms to 15s.
func WithStoreRetry(initial, max time.Duration) Option {
	return dedupOption("WithStoreRetry", idempotency.WithStoreRetry(initial, max))
}

// WithShadow claims and completes as usual but always runs the handler,
// counting would_skip for every message that deduplication would have
// skipped: a way to try deduplication on live traffic.
func WithShadow() Option { return dedupOption("WithShadow", idempotency.WithShadow()) }

// WithFailOpen runs the handler without deduplication while the store is
// unavailable, counted as store_bypassed. The default is fail-closed:
// nothing runs and nothing is acked until the store answers.
func WithFailOpen() Option { return dedupOption("WithFailOpen", idempotency.WithFailOpen()) }

// WithOnDuplicate sets a function called for every duplicate before its ack.
func WithOnDuplicate(f DuplicateFunc) Option {
	return dedupOption("WithOnDuplicate", idempotency.WithOnDuplicate(f))
}
