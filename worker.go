package dedupworker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
)

// The types a handler author uses, under the names of this package.
type (
	// Message is one message as a handler sees it.
	Message = consumer.Message
	// Handler does the work for one message.
	Handler = consumer.Handler
	// HandlerFunc adapts a function to Handler.
	HandlerFunc = consumer.HandlerFunc
	// Source is a transport: transports/kafkasource and transports/natssource make one.
	Source = consumer.Source
	// Store is the deduplication state: redisbackend makes one for
	// production, idempotency/memstore one for tests.
	Store = idempotency.Store
	// Claim is what a running handler knows of its claim (ClaimOf).
	Claim = idempotency.ClaimInfo
	// Middleware wraps a Handler with a cross-cutting concern; it runs
	// after the claim, only when the handler does (see consumer.Middleware).
	Middleware = consumer.Middleware
	// BatchHandler does the work for a run of messages in one call (SPEC
	// §11.4): one Result per message, and each message completes, retries
	// or dead-letters on its own (see consumer.BatchHandler).
	BatchHandler = consumer.BatchHandler
	// BatchFunc adapts a function to a Handler that is also a BatchHandler.
	BatchFunc = consumer.BatchFunc
	// Result is a batch handler's outcome for one message.
	Result = consumer.Result
)

// Batched returns a Handler that runs one message with h and a run with b:
// what a Middleware around a batch handler returns to keep it one.
func Batched(h Handler, b BatchHandler) Handler { return consumer.Batched(h, b) }

// Permanent wraps err so that the message is dead-lettered without further
// attempts.
func Permanent(err error) error { return consumer.Permanent(err) }

// RetryAfter asks for the message to be retried after d instead of the
// configured backoff; it still counts as an attempt.
func RetryAfter(d time.Duration, err error) error { return consumer.RetryAfterErr(d, err) }

// ClaimOf returns the claim the handler runs under: its key, its fence (pass
// it to a downstream system so it can reject a stale writer) and its attempt.
// ok is false outside a deduplicated handler.
func ClaimOf(ctx context.Context) (c Claim, ok bool) { return idempotency.FromContext(ctx) }

// MessageContext returns the context of the i-th message of a batch
// handler's call: ClaimOf on it gives that message's claim, and it ends when
// that claim is lost. Outside a batch call it returns ctx.
func MessageContext(ctx context.Context, i int) context.Context {
	return consumer.MessageContext(ctx, i)
}

// Config configures a Worker. The zero value is usable.
type Config struct {
	// Logger receives the worker's and the engine's logs; nil discards them.
	Logger *slog.Logger
	// Hooks receive every metrics event, of the worker and of the
	// deduplication engine alike (consumer.Hook*).
	Hooks consumer.Hooks
	// ShutdownTimeout bounds the drain after Run's context is cancelled;
	// handlers still running then are cancelled and their claims released.
	// Default 30s.
	ShutdownTimeout time.Duration
	// StoreTimeout bounds every call to the store. Default 5s.
	StoreTimeout time.Duration
	// CompletionLinger is how long a batch handler's completions may wait
	// for other runs' to share their store call, delaying their acks as
	// long (idempotency.Config.CompletionLinger). Default 3ms; negative:
	// none.
	CompletionLinger time.Duration
	// Middleware wraps every handler, outside each handler's own
	// WithMiddleware; the first listed is the outermost. A middleware
	// around a batch handler must return one (consumer.Batched), or Handle
	// fails.
	Middleware []Middleware
	// Wrap wraps every handler's delivery processing, the first listed
	// outermost: for what must see each delivery and its outcome,
	// duplicates included, such as a trace span per delivery
	// (consumer/tracing's Tracer.Wrap).
	Wrap []consumer.ProcessorWrapper
	// Clock schedules lease renewals (idempotency.Config.Clock); tests pass
	// idempotency/idempotencytest's fake. Default: the system clock.
	Clock idempotency.Clock
	// Retry is how handlers registered WithoutDedup retry failures; the
	// deduplicated ones use WithDedup(idempotency.WithBackoff(...)).
	// Default consumer.DefaultRetryPolicy.
	Retry consumer.RetryPolicy
}

// Worker runs deduplicated handlers: each message's idempotency key is
// claimed in the store before its handler runs, a redelivery of a completed
// key is acked with the stored result instead of running again, and the
// claim's lease is renewed while the handler runs. Register handlers with
// Handle, then call Run once.
type Worker struct {
	engine *idempotency.Engine
	w      *consumer.Worker

	mu   sync.Mutex
	used bool // Run was called: the engine is closed after it
}

// NewWorker returns a Worker that deduplicates against store. The store is
// the caller's: the Worker never closes it.
func NewWorker(store Store, cfg Config) (*Worker, error) {
	e, err := idempotency.New(store, idempotency.Config{
		Logger: cfg.Logger, Hooks: cfg.Hooks, StoreTimeout: cfg.StoreTimeout, CompletionLinger: cfg.CompletionLinger, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, err
	}
	return &Worker{
		engine: e,
		w: consumer.NewWorker(consumer.Config{
			Logger: cfg.Logger, Hooks: cfg.Hooks, ShutdownTimeout: cfg.ShutdownTimeout,
			Middleware: cfg.Middleware, Wrap: cfg.Wrap, Retry: cfg.Retry,
		}),
	}, nil
}

// Option configures one handler.
type Option func(*handlerOptions)

type handlerOptions struct {
	dedup   []idempotency.Option
	handle  []consumer.HandleOption
	noDedup bool
}

// WithConcurrency caps how many messages of the handler run at once
// (SPEC §8.1). Default 16.
func WithConcurrency(n int) Option {
	return func(o *handlerOptions) { o.handle = append(o.handle, consumer.WithConcurrency(n)) }
}

// WithMiddleware wraps this handler in mws, inside Config.Middleware; the
// first listed is the outermost. Repeated, it appends.
func WithMiddleware(mws ...Middleware) Option {
	return func(o *handlerOptions) { o.handle = append(o.handle, consumer.WithMiddleware(mws...)) }
}

// WithLease sets how long a claim is owned before another worker may take
// it over; it is renewed every third of it while the handler runs. Default
// 30s.
func WithLease(d time.Duration) Option { return WithDedup(idempotency.WithLease(d)) }

// WithRetention sets how long a completed key is remembered: the
// deduplication window. Default 24h.
func WithRetention(d time.Duration) Option { return WithDedup(idempotency.WithRetention(d)) }

// WithMaxAttempts sets how many runs a key gets before it is dead-lettered.
// Default 5.
func WithMaxAttempts(n int) Option { return WithDedup(idempotency.WithMaxAttempts(n)) }

// WithKey sets where the idempotency key is read from, in order (default:
// the Idempotency-Key header).
func WithKey(sources ...idempotency.KeySource) Option {
	return WithDedup(idempotency.WithKeySources(sources...))
}

// WithDedup passes any option of the deduplication engine (idempotency.With*):
// backoff, missing-key and mismatch policies, in-flight wait, shadow mode,
// and more.
func WithDedup(opts ...idempotency.Option) Option {
	return func(o *handlerOptions) { o.dedup = append(o.dedup, opts...) }
}

// WithoutDedup runs the handler at least once, with no deduplication: acked
// on success, retried on error, dead-lettered on Permanent errors.
func WithoutDedup() Option { return func(o *handlerOptions) { o.noDedup = true } }

// ErrRunning is returned by Handle after Run started, and by a second Run.
var ErrRunning = consumer.ErrWorkerRunning

// Handle registers h under name, fed by src. The name is the deduplication
// scope (SPEC §2): 1-64 letters, digits, '_', '.' or '-', unique within the
// Worker. An invalid option is an error that names it.
func (w *Worker) Handle(name string, src Source, h Handler, opts ...Option) error {
	var o handlerOptions
	for _, opt := range opts {
		opt(&o)
	}
	handle := o.handle
	if !o.noDedup {
		dedup, err := w.engine.Processor(o.dedup...)
		if err != nil {
			return fmt.Errorf("dedupworker: handler %q: %w", name, err)
		}
		handle = append(handle, consumer.WithProcessor(dedup))
	} else if len(o.dedup) > 0 {
		return fmt.Errorf("dedupworker: handler %q: WithoutDedup with deduplication options", name)
	}
	return w.w.Handle(name, src, h, handle...)
}

// Run runs every handler until ctx is cancelled or a source fails, then
// drains (Config.ShutdownTimeout) and waits for the engine's last
// completions before it returns. A Worker runs once.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.used {
		w.mu.Unlock()
		return ErrRunning
	}
	w.used = true
	w.mu.Unlock()
	err := w.w.Run(ctx)
	if errors.Is(err, consumer.ErrWorkerRunning) {
		return err
	}
	return errors.Join(err, w.engine.Close())
}
