package idempotency

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// MissingKeyPolicy says what to do with a message that has no idempotency
// key.
type MissingKeyPolicy string

// Missing-key policies.
const (
	// MissingKeyReject dead-letters the message with reason missing_key and
	// acks it. The default.
	MissingKeyReject MissingKeyPolicy = "reject"
	// MissingKeyPassthrough runs the handler without deduplication.
	MissingKeyPassthrough MissingKeyPolicy = "passthrough"
)

// MismatchPolicy says what to do when a key arrives with a fingerprint other
// than the stored one.
type MismatchPolicy string

// Mismatch policies.
const (
	// MismatchReject dead-letters the message with reason
	// fingerprint_mismatch, acks it and leaves the stored record alone. The
	// default.
	MismatchReject MismatchPolicy = "reject"
	// MismatchIgnore treats the message as a duplicate of the stored record.
	MismatchIgnore MismatchPolicy = "ignore"
)

// DuplicateFunc is called for a delivery the engine acks as a duplicate,
// with the stored record (whose Result is the first run's result), before
// the ack. Use it to answer a requester with the stored reply. Its error is
// logged and does not stop the ack.
type DuplicateFunc func(ctx context.Context, d consumer.Delivery, rec *Record) error

// Option configures one handler's deduplication.
type Option func(*handlerConfig)

type handlerConfig struct {
	keySources     []KeySource
	missingKey     MissingKeyPolicy
	mismatch       MismatchPolicy
	fpHeaders      []string
	lease          time.Duration
	retention      time.Duration
	maxAttempts    int
	backoffInitial time.Duration
	backoffMax     time.Duration
	inFlightWait   time.Duration
	storeRetryMin  time.Duration
	storeRetryMax  time.Duration
	shadow         bool
	failOpen       bool
	onDuplicate    DuplicateFunc
}

func defaultHandlerConfig() handlerConfig {
	retry := dispatch.DefaultRetryPolicy()
	return handlerConfig{
		keySources:     DefaultKeySources(),
		missingKey:     MissingKeyReject,
		mismatch:       MismatchReject,
		lease:          30 * time.Second,
		retention:      24 * time.Hour,
		maxAttempts:    5,
		backoffInitial: retry.BackoffInitial,
		backoffMax:     retry.BackoffMax,
		storeRetryMin:  500 * time.Millisecond,
		storeRetryMax:  15 * time.Second,
	}
}

// WithKeySources sets where keys come from, tried in order.
// Default: header:Idempotency-Key.
func WithKeySources(sources ...KeySource) Option {
	return func(c *handlerConfig) { c.keySources = sources }
}

// WithMissingKey sets the missing-key policy. Default reject.
func WithMissingKey(p MissingKeyPolicy) Option { return func(c *handlerConfig) { c.missingKey = p } }

// WithMismatch sets the fingerprint-mismatch policy. Default
// reject.
func WithMismatch(p MismatchPolicy) Option { return func(c *handlerConfig) { c.mismatch = p } }

// WithFingerprintHeaders adds headers to the fingerprint besides the payload.
func WithFingerprintHeaders(names ...string) Option {
	return func(c *handlerConfig) { c.fpHeaders = names }
}

// WithLease sets the claim lease. It is renewed every third of
// itself while the handler runs. Default 30s.
func WithLease(d time.Duration) Option { return func(c *handlerConfig) { c.lease = d } }

// WithRetention sets how long a completed key is remembered: the
// deduplication window. Default 24h.
func WithRetention(d time.Duration) Option { return func(c *handlerConfig) { c.retention = d } }

// WithMaxAttempts sets how many runs of the handler a key gets before it is
// dead-lettered. Default 5.
func WithMaxAttempts(n int) Option { return func(c *handlerConfig) { c.maxAttempts = n } }

// WithBackoff sets the retry backoff after handler errors: initial, doubling
// up to max, with jitter. Default 1s to 5m.
func WithBackoff(initial, max time.Duration) Option {
	return func(c *handlerConfig) { c.backoffInitial, c.backoffMax = initial, max }
}

// WithInFlightWait bounds how long a delivery waits for another worker that
// holds its key before it is redelivered later. Default: the
// lease.
func WithInFlightWait(d time.Duration) Option { return func(c *handlerConfig) { c.inFlightWait = d } }

// WithStoreRetry sets the backoff for redeliveries while the store is
// unavailable. Default 500ms to 15s.
func WithStoreRetry(initial, max time.Duration) Option {
	return func(c *handlerConfig) { c.storeRetryMin, c.storeRetryMax = initial, max }
}

// WithShadow enables shadow mode: claims and completes as usual
// but always runs the handler, counting would_skip for every delivery that
// enforcement would have skipped.
func WithShadow() Option { return func(c *handlerConfig) { c.shadow = true } }

// WithFailOpen runs the handler without deduplication when the store is
// unavailable, counted as store_bypassed. The default is
// fail-closed: nothing runs and nothing is acked until the store answers.
func WithFailOpen() Option { return func(c *handlerConfig) { c.failOpen = true } }

// WithOnDuplicate sets a hook called for every duplicate before its ack.
func WithOnDuplicate(f DuplicateFunc) Option { return func(c *handlerConfig) { c.onDuplicate = f } }

// ErrInvalidOption is wrapped by every error an invalid handler option
// causes: a *consumer.ConfigError whose Field is the option's name without
// With ("Lease", "MaxAttempts", "Backoff.Max").
var ErrInvalidOption = errors.New("dedup: invalid option")

// ValidateOptions checks handler options as Engine.Middleware does, without
// an engine: nil, or the first invalid option's *consumer.ConfigError
// (wrapping ErrInvalidOption). The binary's config validates with it and
// maps the Field to the YAML key.
func ValidateOptions(opts ...Option) error {
	cfg := defaultHandlerConfig()
	for _, o := range opts {
		o(&cfg)
	}
	return cfg.validate()
}

func (c *handlerConfig) validate() error {
	bad := func(field, format string, args ...any) error {
		return &consumer.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...), Err: ErrInvalidOption}
	}
	if len(c.keySources) == 0 {
		return bad("KeySources", "at least one key source is required, e.g. HeaderKey(\"Idempotency-Key\")")
	}
	for i, s := range c.keySources {
		if s.kind == "" || (s.kind == "func" && s.fn == nil) {
			return bad(fmt.Sprintf("KeySources[%d]", i), "empty key source: build it with HeaderKey, JSONKey, KeyFrom, ...")
		}
	}
	switch {
	case c.missingKey != MissingKeyReject && c.missingKey != MissingKeyPassthrough:
		return bad("MissingKey", "%q: want %s or %s", c.missingKey, MissingKeyReject, MissingKeyPassthrough)
	case c.mismatch != MismatchReject && c.mismatch != MismatchIgnore:
		return bad("Mismatch", "%q: want %s or %s", c.mismatch, MismatchReject, MismatchIgnore)
	case c.lease < 100*time.Millisecond:
		return bad("Lease", "%s: must be at least 100ms", c.lease)
	case c.retention < time.Second:
		return bad("Retention", "%s: must be at least 1s", c.retention)
	case c.maxAttempts < 1:
		return bad("MaxAttempts", "%d: must be at least 1", c.maxAttempts)
	case c.backoffInitial <= 0:
		return bad("Backoff.Initial", "%s: must be positive, e.g. 1s", c.backoffInitial)
	case c.backoffMax < c.backoffInitial:
		return bad("Backoff.Max", "%s is below Backoff.Initial %s: want initial <= max", c.backoffMax, c.backoffInitial)
	case c.inFlightWait < 0:
		return bad("InFlightWait", "%s: must not be negative (0 means the lease)", c.inFlightWait)
	case c.storeRetryMin <= 0:
		return bad("StoreRetry.Initial", "%s: must be positive, e.g. 500ms", c.storeRetryMin)
	case c.storeRetryMax < c.storeRetryMin:
		return bad("StoreRetry.Max", "%s is below StoreRetry.Initial %s: want initial <= max", c.storeRetryMax, c.storeRetryMin)
	}
	if c.inFlightWait == 0 {
		c.inFlightWait = c.lease
	}
	c.fpHeaders = slices.Clone(c.fpHeaders)
	slices.SortFunc(c.fpHeaders, func(a, b string) int { return strings.Compare(strings.ToLower(a), strings.ToLower(b)) })
	return nil
}
