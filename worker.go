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
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// Config configures a [Worker]. The zero value is usable.
type Config struct {
	// Logger receives the worker's and the engine's logs; nil discards them.
	Logger *slog.Logger
	// Hooks receive every metrics event, of the worker, the deduplication
	// engine and the store alike. Each must implement at least one of the
	// Hook* interfaces ([HookOutcome], [HookHandlerDone], [HookInflight],
	// [HookStoreCall], [HookLeaseRenewal], [HookDurabilityShortfall],
	// [HookCorruptRecord]), or [NewWorker] refuses it.
	Hooks []Hook
	// ShutdownTimeout bounds the drain after Run's context is cancelled;
	// handlers still running then are cancelled and their claims released.
	// Default 30s; negative: cancel at once.
	ShutdownTimeout time.Duration
	// StoreTimeout bounds every call to the store. Default 5s.
	StoreTimeout time.Duration
	// CompletionLinger is how long a batch handler's completions may wait
	// for other runs' to share their store call, delaying their acks as
	// long. Default 3ms; negative: none.
	CompletionLinger time.Duration
	// Middleware wraps every handler, outside each handler's own
	// [WithMiddleware]; the first listed is the outermost. A middleware
	// around a batch handler must return one ([Batched]), or Handle fails.
	Middleware []Middleware
	// Wrap wraps every handler's delivery processing, the first listed
	// outermost: for what must see each delivery and its outcome,
	// duplicates included, such as a trace span per delivery (the tracing
	// package's Tracer.Wrap). A delivery goes Wrap[0], ..., the
	// deduplication, Middleware[0], ..., the handler's middleware, the
	// handler.
	Wrap []Wrapper
	// Clock schedules lease renewals; tests pass
	// idempotency/idempotencytest's fake. Default: the system clock.
	Clock Clock
}

// Worker runs deduplicated handlers: each message's idempotency key is
// claimed in the store before its handler runs, a redelivery of a completed
// key is acked with the stored result instead of running again, and the
// claim's lease is renewed while the handler runs. Register handlers with
// [Worker.Handle], then call [Worker.Run] once.
type Worker struct {
	engine *idempotency.Engine
	w      *dispatch.Worker

	mu   sync.Mutex
	used bool // Run was called: the engine is closed after it
}

// NewWorker returns a Worker that deduplicates against store. The store is
// the caller's: the Worker never closes it. A refused Config field is a
// [ConfigError] wrapping [ErrInvalidConfig].
func NewWorker(store Store, cfg Config) (*Worker, error) {
	if store == nil {
		return nil, &ConfigError{Field: "store", Reason: "nil: pass a store (redisbackend.New, memstore.New)", Err: ErrInvalidConfig}
	}
	hooks, err := checkHooks(cfg.Hooks)
	if err != nil {
		return nil, err
	}
	e, err := idempotency.New(store, idempotency.Config{
		Logger: cfg.Logger, Hooks: hooks, StoreTimeout: cfg.StoreTimeout, CompletionLinger: cfg.CompletionLinger, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, err
	}
	return &Worker{
		engine: e,
		w: dispatch.NewWorker(dispatch.Config{
			Logger: cfg.Logger, Hooks: hooks, ShutdownTimeout: cfg.ShutdownTimeout,
			Middleware: cfg.Middleware, Wrap: cfg.Wrap,
		}),
	}, nil
}

// checkHooks refuses a hook that implements none of the Hook* interfaces:
// it would receive nothing, which is always a mistake (a pointer receiver
// missed, a method misspelt).
func checkHooks(hs []Hook) (consumer.Hooks, error) {
	for i, h := range hs {
		switch h.(type) {
		case HookOutcome, HookHandlerDone, HookInflight, HookStoreCall,
			HookLeaseRenewal, HookDurabilityShortfall, HookCorruptRecord:
			continue
		}
		return nil, &ConfigError{
			Field: fmt.Sprintf("Hooks[%d]", i),
			Reason: fmt.Sprintf("%T implements no hook interface: give it a method of one of HookOutcome (OnOutcome), HookHandlerDone (OnHandlerDone), "+
				"HookInflight (OnInflight), HookStoreCall (OnStoreCall), HookLeaseRenewal (OnLeaseRenewal), HookDurabilityShortfall (OnDurabilityShortfall) "+
				"or HookCorruptRecord (OnCorruptRecord), with the receiver the value has", h),
			Err: ErrInvalidConfig,
		}
	}
	return consumer.Hooks(hs), nil
}

// Handle registers h under name, fed by src. The name is the deduplication
// scope: 1-64 letters, digits, '_', '.' or '-', unique within the Worker. An
// invalid option is a [ConfigError] that names it.
func (w *Worker) Handle(name string, src Source, h Handler, opts ...Option) error {
	var o handlerOptions
	for _, opt := range opts {
		opt(&o)
	}
	handle := []dispatch.HandleOption{dispatch.WithMiddleware(o.middleware...)}
	if o.concurrency != nil {
		handle = append(handle, dispatch.WithConcurrency(*o.concurrency))
	}
	if o.noDedup {
		if len(o.dedupOnly) > 0 {
			return fmt.Errorf("dedup: handler %q: WithoutDedup with %s, which only a deduplicated handler has", name, o.dedupOnly[0])
		}
		retry := dispatch.DefaultRetryPolicy()
		var check []idempotency.Option
		if o.backoff != nil {
			retry.BackoffInitial, retry.BackoffMax = o.backoff[0], o.backoff[1]
			check = append(check, idempotency.WithBackoff(o.backoff[0], o.backoff[1]))
		}
		if o.maxAttempts != nil {
			retry.MaxAttempts = *o.maxAttempts
			check = append(check, idempotency.WithMaxAttempts(*o.maxAttempts))
		}
		if err := idempotency.ValidateOptions(check...); err != nil {
			return fmt.Errorf("dedup: handler %q: %w", name, err)
		}
		handle = append(handle, dispatch.WithRetry(retry))
	} else {
		dedup, err := w.engine.Processor(o.engineOptions()...)
		if err != nil {
			return fmt.Errorf("dedup: handler %q: %w", name, err)
		}
		handle = append(handle, dispatch.WithProcessor(dedup))
	}
	return w.w.Handle(name, src, h, handle...)
}

// Run runs every handler until ctx is cancelled or a source fails, then
// drains ([Config.ShutdownTimeout]) and waits for the engine's last
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
	if errors.Is(err, dispatch.ErrWorkerRunning) {
		return err
	}
	return errors.Join(err, w.engine.Close())
}
