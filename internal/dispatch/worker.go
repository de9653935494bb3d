package dispatch

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/dedupworker/consumer"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/idemkit/dedupworker/internal/ctxshare"
)

// ErrShutdownTimeout is the cause of handler contexts cancelled because the
// worker's drain (Config.ShutdownTimeout) ran out.
var ErrShutdownTimeout = errors.New("dedup: shutdown timeout: handler cancelled")

// ErrWorkerRunning is returned by Handle after Run started, and by a second
// concurrent Run.
var ErrWorkerRunning = errors.New("dedup: worker already running")

// Config configures a Worker. The zero value is usable.
type Config struct {
	// Logger receives the worker's logs; nil discards them.
	Logger *slog.Logger
	// Hooks receive metrics events (see Hook). The deduplication engine takes
	// its own hooks; pass the same list to both.
	Hooks consumer.Hooks
	// ShutdownTimeout bounds the drain after Run's context is cancelled:
	// in-flight handlers may finish within it; the rest are cancelled with
	// cause ErrShutdownTimeout and their claims released.
	// Default 30s; negative means cancel at once.
	ShutdownTimeout time.Duration
	// Middleware wraps every handler, outside the handler's own
	// WithMiddleware; the first listed is the outermost (see Middleware).
	Middleware []consumer.Middleware
	// Wrap wraps every handler's Processor, the first listed outermost: for
	// what must see each delivery and its outcome, such as tracing's
	// Tracer.Wrap. A delivery goes Wrap[0], Wrap[1], ..., the Processor,
	// Middleware[0], ..., the handler's middleware, the handler.
	Wrap []consumer.ProcessorWrapper
	// Retry is how handlers registered without a middleware retry failures
	// (Decide). A backoff left zero (both fields) is DefaultRetryPolicy's.
	// The deduplication engine has its own (idempotency.WithBackoff,
	// WithMaxAttempts).
	Retry RetryPolicy
}

func (c *Config) withDefaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.ShutdownTimeout < 0 {
		c.ShutdownTimeout = 0
	}
	if c.Retry.BackoffInitial == 0 && c.Retry.BackoffMax == 0 {
		def := DefaultRetryPolicy()
		c.Retry.BackoffInitial, c.Retry.BackoffMax = def.BackoffInitial, def.BackoffMax
	}
}

// Worker runs registered handlers, each behind its Source, until its context
// is cancelled. Register with Handle, then call Run once.
type Worker struct {
	cfg Config

	mu       sync.Mutex
	running  bool
	handlers []*registration
}

type registration struct {
	name        string
	src         consumer.Source
	handler     consumer.Handler // with every middleware applied
	concurrency int
	middleware  []consumer.Middleware
	processor   consumer.ProcessorFactory
	setProc     bool // WithProcessor was given, maybe with nil
	retry       *RetryPolicy
}

// NewWorker returns a Worker with cfg's defaults filled in.
func NewWorker(cfg Config) *Worker {
	cfg.withDefaults()
	return &Worker{cfg: cfg}
}

// HandleOption configures one registered handler.
type HandleOption func(*registration)

// WithConcurrency caps how many deliveries of this handler run at once.
// Default 16.
func WithConcurrency(n int) HandleOption { return func(r *registration) { r.concurrency = n } }

// WithMiddleware wraps this handler in mws, inside Config.Middleware; the
// first listed is the outermost. Repeated, it appends.
func WithMiddleware(mws ...consumer.Middleware) HandleOption {
	return func(r *registration) { r.middleware = append(r.middleware, mws...) }
}

// WithProcessor sets what takes the handler's deliveries to settlement,
// typically the deduplication engine: WithProcessor(engine.Processor(...)).
// Without it the handler runs at least once: acked on success, retried on
// error with a backoff of 1s doubling to 5m, dead-lettered on Permanent
// errors.
func WithProcessor(f consumer.ProcessorFactory) HandleOption {
	return func(r *registration) { r.processor, r.setProc = f, true }
}

// WithRetry sets how the handler retries failures when it has no
// processor (WithProcessor), instead of Config.Retry.
func WithRetry(p RetryPolicy) HandleOption { return func(r *registration) { r.retry = &p } }

var validName = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,64}$`)

// Handle registers handler h under name, fed by src. The name is the
// deduplication scope: 1–64 characters of letters, digits, '_', '.'
// and '-', unique within the worker. It fails when a middleware drops a
// BatchHandler (ErrMiddlewareDropsBatch).
func (w *Worker) Handle(name string, src consumer.Source, h consumer.Handler, opts ...HandleOption) error {
	r := &registration{name: name, src: src, handler: h, concurrency: 16}
	for _, o := range opts {
		o(r)
	}
	switch {
	case !validName.MatchString(name):
		return fmt.Errorf("dedup: handler name %q: use 1-64 letters, digits, '_', '.' or '-'", name)
	case src == nil:
		return fmt.Errorf("dedup: handler %q: source is nil", name)
	case h == nil:
		return fmt.Errorf("dedup: handler %q: handler is nil", name)
	case r.concurrency < 1:
		return fmt.Errorf("dedup: handler %q: concurrency %d: must be at least 1", name, r.concurrency)
	case r.setProc && r.processor == nil:
		return fmt.Errorf("dedup: handler %q: WithProcessor(nil): pass the engine's processor, or leave the option out to run at least once", name)
	}
	for i, wr := range w.cfg.Wrap {
		if wr == nil {
			return fmt.Errorf("dedup: handler %q: Config.Wrap[%d] is nil", name, i)
		}
	}
	mws := append(append([]consumer.Middleware(nil), w.cfg.Middleware...), r.middleware...)
	wrapped, err := Chain(h, mws...)
	if err != nil {
		return fmt.Errorf("dedup: handler %q: %w", name, err)
	}
	r.handler = wrapped
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running {
		return ErrWorkerRunning
	}
	for _, o := range w.handlers {
		if o.name == name {
			return fmt.Errorf("dedup: handler %q registered twice", name)
		}
	}
	w.handlers = append(w.handlers, r)
	return nil
}

// Run runs every registered handler until ctx is cancelled or a source fails.
//
// On cancellation it stops fetching, lets in-flight handlers finish within
// ShutdownTimeout, cancels the rest (they release their claims and the
// message is redelivered), waits for every source to finish its bookkeeping
// and returns nil. If a source fails, the others are stopped the same way and
// Run returns the failure. It fails before anything starts when a
// WithProcessor factory or a Config.Wrap wrapper returns nil.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.running {
		w.mu.Unlock()
		return ErrWorkerRunning
	}
	if len(w.handlers) == 0 {
		w.mu.Unlock()
		return errors.New("dedup: worker has no handlers: call Handle before Run")
	}
	w.running = true
	handlers := append([]*registration(nil), w.handlers...)
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.running = false
		w.mu.Unlock()
	}()

	fetchCtx, stopFetch := context.WithCancelCause(ctx)
	defer stopFetch(nil)
	// workCtx outlives fetchCtx by the drain timeout; it carries ctx's values.
	workCtx, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelWork(nil)

	runners := make([]*runner, len(handlers))
	for i, reg := range handlers {
		r, err := w.newRunner(reg, workCtx)
		if err != nil {
			return err
		}
		runners[i] = r
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i, reg := range handlers {
		r := runners[i]
		wg.Go(func() {
			w.cfg.Logger.Info("handler started", "handler", reg.name, "concurrency", reg.concurrency)
			err := reg.src.Consume(fetchCtx, r)
			if err != nil && fetchCtx.Err() == nil {
				err = fmt.Errorf("dedup: handler %q: %w", reg.name, err)
				w.cfg.Logger.Error("source failed; stopping the worker", "handler", reg.name, "err", err)
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				stopFetch(err)
			}
		})
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	select {
	case <-done:
		return errors.Join(errs...)
	case <-fetchCtx.Done():
	}
	w.cfg.Logger.Info("stopping: draining in-flight handlers", "timeout", w.cfg.ShutdownTimeout, "cause", context.Cause(fetchCtx))
	timer := time.NewTimer(w.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		w.cfg.Logger.Warn("drain timeout: cancelling in-flight handlers", "timeout", w.cfg.ShutdownTimeout)
		cancelWork(ErrShutdownTimeout)
		<-done
	}
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(errs...)
}

// newRunner makes reg's Processor and wraps it in Config.Wrap; it fails when
// the factory or a wrapper returns nil.
func (w *Worker) newRunner(reg *registration, workCtx context.Context) (*runner, error) {
	r := &runner{
		name:    reg.name,
		limit:   reg.concurrency,
		sem:     make(chan struct{}, reg.concurrency),
		hooks:   w.cfg.Hooks,
		workCtx: workCtx,
	}
	if reg.processor != nil {
		if r.proc = reg.processor(reg.name, reg.handler); r.proc == nil {
			return nil, fmt.Errorf("dedup: handler %q: the WithProcessor factory returned a nil Processor", reg.name)
		}
	} else {
		retry := w.cfg.Retry
		if reg.retry != nil {
			retry = *reg.retry
		}
		r.proc = &direct{name: reg.name, h: reg.handler, hooks: w.cfg.Hooks, log: w.cfg.Logger, retry: retry}
	}
	for i := len(w.cfg.Wrap) - 1; i >= 0; i-- {
		if r.proc = w.cfg.Wrap[i](reg.name, r.proc); r.proc == nil {
			return nil, fmt.Errorf("dedup: handler %q: Config.Wrap[%d] returned a nil Processor", reg.name, i)
		}
	}
	return r, nil
}

// runner implements Runner for one registration.
type runner struct {
	name    string
	limit   int
	sem     chan struct{}
	proc    consumer.Processor
	hooks   consumer.Hooks
	workCtx context.Context // the worker's hard-stop context; cancelled after the drain timeout
	binds   ctxshare.Binder // binds delivery contexts to workCtx
}

func (r *runner) Name() string     { return r.name }
func (r *runner) Concurrency() int { return r.limit }

func (r *runner) Prepare(ctx context.Context, batch []consumer.Delivery) {
	if len(batch) == 0 {
		return
	}
	ctx, cancel := r.bind(ctx)
	defer cancel()
	r.proc.Prepare(ctx, batch)
}

func (r *runner) Process(ctx context.Context, d consumer.Delivery) {
	ctx, cancel := r.bind(ctx)
	defer cancel()
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		// Still hand it over: the processor settles a cancelled delivery.
		r.proc.Process(ctx, d)
		return
	}
	defer func() { <-r.sem }()
	r.hooks.Inflight(r.name, 1)
	defer r.hooks.Inflight(r.name, -1)
	r.proc.Process(ctx, d)
}

func (r *runner) Batching() bool { return r.proc.Batching() }

func (r *runner) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	if len(ds) == 0 {
		return
	}
	ctx, cancel := r.bind(ctx)
	defer cancel()
	select {
	case r.sem <- struct{}{}:
		defer func() { <-r.sem }()
		r.hooks.Inflight(r.name, len(ds))
		defer r.hooks.Inflight(r.name, -len(ds))
	case <-ctx.Done():
		// Still hand them over: the processor settles cancelled deliveries.
	}
	r.proc.ProcessBatch(ctx, ds)
}

// bind returns ctx also cancelled, with the worker's cause, when the worker's
// drain runs out. The bound context is shared between the deliveries that
// pass the same context (ctxshare.Binder).
func (r *runner) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	return r.binds.Bind(ctx, r.workCtx)
}
