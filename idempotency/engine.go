package idempotency

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/ctxshare"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// Config configures an Engine. The zero value is usable.
type Config struct {
	// Logger receives the engine's logs; nil discards them. Payloads are
	// never logged.
	Logger *slog.Logger
	// Hooks receive metrics events (consumer.Hook*).
	Hooks consumer.Hooks
	// StoreTimeout bounds every store call. Default 5s.
	StoreTimeout time.Duration
	// CompletionLinger is how long the completions of a batch handler's
	// run may wait for other runs' to share their store call: while fewer
	// than 32 are queued and a handler of the engine is still running,
	// whose results may join. At a steady rate, where a run holds a
	// message or two, completions then go several to a call instead of
	// one each, and every call costs Redis far more than a key in it.
	// Only the run's acks, and the concurrency slot it holds, wait as
	// long: the Kafka source starts a lane's next run meanwhile
	// (consumer.RunHandledNotifier). A single delivery's completion, which its
	// lane or slot waits for, never waits, and takes any that linger
	// along. Default 3ms (DefaultCompletionLinger); a negative value
	// turns the linger off.
	CompletionLinger time.Duration
	// Clock is the local time that schedules lease renewals and estimates
	// a lease's end (see Clock). Default: the system clock. Waits and
	// timeouts of store calls always take real time.
	Clock Clock
}

// DefaultCompletionLinger is Config.CompletionLinger's default.
const DefaultCompletionLinger = 3 * time.Millisecond

// Engine deduplicates deliveries against a Store. One Engine serves any
// number of handlers; each gets its Processor from Processor.
type Engine struct {
	store     Store
	log       *slog.Logger
	hooks     consumer.Hooks
	timeout   time.Duration
	clock     Clock
	completer *batcher[Completion, bool]
	claimer   *batcher[ClaimRequest, ClaimResult]
	// preparer sends Prepare's batch claims: one call in flight, the
	// fetches of other partitions meanwhile together in the next.
	preparer *batcher[ClaimRequest, ClaimResult]
	// handlers counts the handler calls of claimed deliveries running now:
	// while none runs, no completion is about to join a lingering call
	// (a source short of concurrency slots waits for those the lingering
	// runs hold), and the linger ends.
	handlers atomic.Int64

	// Shared deadlines for the calls every delivery makes: completing its
	// key and settling it, with no context or timer of their own
	// (BenchmarkEngine's allocs/op guards them).
	completeBy ctxshare.Deadlines
	settleBy   ctxshare.Deadlines
}

// New returns an Engine over store.
func New(store Store, cfg Config) (*Engine, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidOption)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StoreTimeout == 0 {
		cfg.StoreTimeout = 5 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	switch {
	case cfg.CompletionLinger == 0:
		cfg.CompletionLinger = DefaultCompletionLinger
	case cfg.CompletionLinger < 0:
		cfg.CompletionLinger = 0
	}
	if cfg.StoreTimeout < 0 {
		return nil, fmt.Errorf("%w: StoreTimeout %s: must be positive", ErrInvalidOption, cfg.StoreTimeout)
	}
	e := &Engine{
		store:   observed{s: store, hooks: cfg.Hooks},
		log:     cfg.Logger,
		hooks:   cfg.Hooks,
		timeout: cfg.StoreTimeout,
		clock:   cfg.Clock,
	}
	e.completer = newCompleter(e.store, e.timeout, cfg.CompletionLinger)
	e.completer.idle = func() bool { return e.handlers.Load() == 0 }
	e.claimer = newClaimer(e.store, e.timeout)
	e.preparer = newPrepareClaimer(e.store, e.timeout)
	e.completeBy.D = e.timeout
	e.settleBy.D = settleTimeout
	return e, nil
}

// handlerStarted counts a handler call of a claimed delivery or run;
// handlerReturned ends it.
func (e *Engine) handlerStarted() { e.handlers.Add(1) }

func (e *Engine) handlerReturned() {
	if e.handlers.Add(-1) == 0 {
		e.completer.nudge()
	}
}

// Close waits for the engine's background completions to finish, sending at
// once those that linger (Config.CompletionLinger). Call it
// after the Worker's Run returned; the Store is closed by its owner.
func (e *Engine) Close() error {
	e.completer.wait()
	e.claimer.wait()
	e.preparer.wait()
	return nil
}

// Processor returns what makes the deduplicating consumer.Processor of a
// handler with opts (the Worker registers it). It fails, naming the option,
// when an option is invalid.
func (e *Engine) Processor(opts ...Option) (consumer.ProcessorFactory, error) {
	cfg := defaultHandlerConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return func(name string, next consumer.Handler) consumer.Processor {
		return &processor{
			e:             e,
			name:          name,
			h:             next,
			cfg:           cfg,
			log:           e.log.With("handler", name),
			prepared:      make(map[consumer.Delivery]*prepared),
			held:          make(map[string]*prepared),
			renewals:      schedule{clock: e.clock, tick: max(cfg.lease/100, time.Millisecond)},
			retry:         dispatch.RetryPolicy{MaxAttempts: cfg.maxAttempts, BackoffInitial: cfg.backoffInitial, BackoffMax: cfg.backoffMax},
			storeRetry:    dispatch.RetryPolicy{BackoffInitial: cfg.storeRetryMin, BackoffMax: cfg.storeRetryMax},
			inFlightRetry: dispatch.RetryPolicy{BackoffInitial: cfg.backoffInitial, BackoffMax: max(cfg.backoffInitial, cfg.lease)},
		}
	}, nil
}

// processor is the Processor of one handler.
type processor struct {
	e    *Engine
	name string
	h    consumer.Handler
	cfg  handlerConfig
	log  *slog.Logger

	// retry decides the fate of a failed handler run (the worker's Decide) and
	// the delay of a retry after a failed dead-letter publish; storeRetry
	// the delay of a redelivery while the store is unavailable;
	// inFlightRetry that of a key still in flight elsewhere after the wait,
	// at most a lease.
	retry, storeRetry, inFlightRetry dispatch.RetryPolicy

	renewals schedule // of the running handlers' lease renewals

	mu       sync.Mutex
	prepared map[consumer.Delivery]*prepared
	// held indexes, by effective key, the owned claims that Prepare
	// made and whose delivery has not started yet. A delivery of the same
	// key that runs first (a duplicate in the batch, or in another Kafka
	// partition) adopts the claim instead of waiting for it to expire.
	held map[string]*prepared
}

// prepared is what the engine knows of a delivery before it runs: its key,
// fingerprint and, after a batch claim, the claim's result.
type prepared struct {
	key  string // raw key; "" when missing
	ekey string
	fp   string

	claimed bool // res/err hold a claim made for this delivery
	// batched is set while res is the answer of the batch claim: for
	// IN_FLIGHT it may be stale by the time the delivery runs (the other
	// delivery of the key, often in this very process, may have finished).
	batched bool
	res     ClaimResult
	err     error
	claimAt time.Time // when the claim was requested, on the engine's Clock
	// out is set while Prepare's claim, which it did not wait for (a
	// store that routes keys to nodes, one slow to answer), is not
	// answered into res and err; until then they are not read (await).
	// It is cleared under the processor's mu, which also guards ready: a
	// waiter makes it, and the answer closes it. taken is set, under the
	// processor's mu, once its delivery took it.
	out   atomic.Bool
	ready chan struct{}
	taken bool
}
