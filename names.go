package dedupworker

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/claimctx"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// The types a handler author uses. They are the transport contract's
// (package consumer) and the engine's (package idempotency) under the names
// of this package, so that a program needs no other package of this module
// than this one, a store and a source.
type (
	// Message is one message as a handler sees it.
	Message = consumer.Message
	// Header holds a message's headers; Get and Set ignore the case of a
	// name.
	Header = consumer.Header
	// Handler does the work for one message.
	Handler = consumer.Handler
	// HandlerFunc adapts a function to [Handler].
	HandlerFunc = consumer.HandlerFunc
	// BatchHandler does the work for a run of messages in one call: one
	// [Result] per message, and each message completes, retries or
	// dead-letters on its own.
	BatchHandler = consumer.BatchHandler
	// BatchFunc adapts a function to a [Handler] that is also a
	// [BatchHandler].
	BatchFunc = consumer.BatchFunc
	// Result is a batch handler's outcome for one message.
	Result = consumer.Result
	// Middleware wraps a [Handler] with a cross-cutting concern; it runs
	// after the claim, only when the handler does.
	Middleware = consumer.Middleware
	// Wrapper wraps each handler's processing of its deliveries, seeing
	// every delivery and its outcome, duplicates included: [Config.Wrap].
	// The tracing package's Tracer.Wrap is one.
	Wrapper = consumer.ProcessorWrapper
	// Source is a transport: transports/kafkasource and
	// transports/natssource make one.
	Source = consumer.Source
	// Store is the deduplication state: redisbackend makes one for
	// production, idempotency/memstore one for tests.
	Store = idempotency.Store
	// KeySource is one place an idempotency key is read from: [HeaderKey],
	// [JSONKey], [KafkaKey], [NatsMsgID], [PayloadHash] or [KeyFrom].
	KeySource = idempotency.KeySource
	// MissingKeyPolicy is what [WithMissingKey] does with a message that
	// has no key.
	MissingKeyPolicy = idempotency.MissingKeyPolicy
	// MismatchPolicy is what [WithMismatch] does with a key reused for
	// other content.
	MismatchPolicy = idempotency.MismatchPolicy
	// DuplicateFunc is called for every duplicate before its ack
	// ([WithOnDuplicate]).
	DuplicateFunc = idempotency.DuplicateFunc
	// Clock is the local time that schedules lease renewals
	// ([Config.Clock]); tests pass idempotency/idempotencytest's fake.
	Clock = idempotency.Clock
	// ConfigError is a refused configuration value: its field, what is
	// wrong and how to fix it. Match it with errors.As.
	ConfigError = consumer.ConfigError
	// PermanentError is what [Permanent] returns.
	PermanentError = consumer.PermanentError
	// RetryError is what [RetryAfter] returns.
	RetryError = consumer.RetryError
	// PanicError is the error a recovered handler panic becomes.
	PanicError = consumer.PanicError
)

// The missing-key and mismatch policies.
const (
	// MissingKeyReject dead-letters a message without a key (the default).
	MissingKeyReject = idempotency.MissingKeyReject
	// MissingKeyPassthrough runs a message without a key, without
	// deduplication.
	MissingKeyPassthrough = idempotency.MissingKeyPassthrough
	// MismatchReject dead-letters a message whose key was completed for
	// other content (the default).
	MismatchReject = idempotency.MismatchReject
	// MismatchIgnore treats such a message as a duplicate.
	MismatchIgnore = idempotency.MismatchIgnore
)

// Errors a handler's context or a call of this package may carry.
var (
	// ErrLeaseLost is the cause of a handler's context when its claim was
	// taken over; the new owner finishes the message.
	ErrLeaseLost = idempotency.ErrLeaseLost
	// ErrStoreUnavailable wraps a failed store call.
	ErrStoreUnavailable = idempotency.ErrStoreUnavailable
	// ErrRunning is returned by [Worker.Handle] after Run started, and by a
	// second Run.
	ErrRunning = dispatch.ErrWorkerRunning
	// ErrInvalidConfig is wrapped by the [ConfigError] that [NewWorker]
	// returns for a refused [Config] field.
	ErrInvalidConfig = errors.New("dedup: invalid config")
)

// Batched returns a Handler that runs one message with h and a run with b:
// what a [Middleware] around a batch handler returns to keep it one.
func Batched(h Handler, b BatchHandler) Handler { return consumer.Batched(h, b) }

// Permanent wraps err so that the message is dead-lettered without further
// attempts.
func Permanent(err error) error { return dispatch.Permanent(err) }

// RetryAfter asks for the message to be retried after d instead of the
// configured backoff, carrying err (which may be nil) for logs and
// dead-letter headers; it still counts as an attempt.
func RetryAfter(d time.Duration, err error) error { return dispatch.RetryAfter(d, err) }

// Claim is the claim a handler runs under ([ClaimOf]).
type Claim struct {
	// Handler is the scope: the name the handler was registered under.
	Handler string
	// Key is the raw idempotency key.
	Key string
	// EffectiveKey is "<scope>:<key>" as stored (without the namespace).
	EffectiveKey string
	// Fence grows with every new owner of the key, also after its record
	// was lost (expired, deleted, a wiped Redis): pass it to downstream
	// systems so they can reject a stale writer, one whose fence is lower
	// than the highest they have seen for the key.
	Fence int64
	// Attempt is the 1-based run of the handler for this key.
	Attempt int
	// Reclaimed is true when this run took over an expired lease of a
	// worker that crashed or stalled: its side effects may be partly done.
	Reclaimed bool
}

// ClaimOf returns the claim the handler runs under. ok is false outside a
// deduplicated run (a handler registered [WithoutDedup], a passthrough of a
// missing key, shadow-mode duplicates, fail-open).
func ClaimOf(ctx context.Context) (c Claim, ok bool) {
	r, ok := claimctx.From(ctx)
	if !ok {
		return Claim{}, false
	}
	return Claim(r.Claim()), true
}

// Step runs fn once per key across retries and crashes: when the key's
// handler runs again, a step that finished before returns its stored result
// without calling fn. Each finished step's result is stored, fenced by the
// claim, before Step returns, so a repeat of a side effect is limited to a
// crash inside that step. Name steps uniquely within a handler.
//
// Outside a deduplicated run Step just calls fn. If the claim was lost, Step
// returns an error wrapping [ErrLeaseLost]; if the result cannot be stored,
// an error wrapping [ErrStoreUnavailable] (the step runs again on retry).
func Step(ctx context.Context, name string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	r, ok := claimctx.From(ctx)
	if !ok {
		return fn(ctx)
	}
	return r.Step(ctx, name, fn)
}

// MessageContext returns the context of the i-th message of a batch
// handler's call: [ClaimOf] on it gives that message's claim, and it ends
// when that claim is lost. Outside a batch call it returns ctx.
func MessageContext(ctx context.Context, i int) context.Context {
	return dispatch.MessageContext(ctx, i)
}

// HeaderKey reads the key from a message header.
func HeaderKey(name string) KeySource { return idempotency.HeaderKey(name) }

// JSONKey reads the key from a string or number field of a JSON payload,
// at a dotted path ("order.id").
func JSONKey(path string) KeySource { return idempotency.JSONKey(path) }

// KafkaKey uses the Kafka record key. A Kafka key is usually an entity id,
// not a message id: use it only when producers set one key per message.
func KafkaKey() KeySource { return idempotency.KafkaKey() }

// NatsMsgID uses the Nats-Msg-Id header, the publisher's deduplication ID.
func NatsMsgID() KeySource { return idempotency.NatsMsgID() }

// PayloadHash uses a hash of the payload: identical payloads are the same
// message.
func PayloadHash() KeySource { return idempotency.PayloadHash() }

// KeyFrom computes the key with f; name labels it in logs and errors. An
// empty key with a nil error counts as missing.
func KeyFrom(name string, f func(m *Message) (string, error)) KeySource {
	return idempotency.KeyFrom(name, f)
}
