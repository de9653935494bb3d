package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/dedupworker/consumer"
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
}

// Engine deduplicates deliveries against a Store. One Engine serves any
// number of handlers; each gets its Processor from Processor.
type Engine struct {
	store     Store
	log       *slog.Logger
	hooks     consumer.Hooks
	timeout   time.Duration
	completer *batcher[Completion, bool]
	claimer   *batcher[ClaimRequest, ClaimResult]

	// Shared deadlines for the calls every delivery makes: completing its
	// key and settling it (see deadlines).
	completeBy deadlines
	settleBy   deadlines
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
	if cfg.StoreTimeout < 0 {
		return nil, fmt.Errorf("%w: StoreTimeout %s: must be positive", ErrInvalidOption, cfg.StoreTimeout)
	}
	e := &Engine{
		store:   observed{s: store, hooks: cfg.Hooks},
		log:     cfg.Logger,
		hooks:   cfg.Hooks,
		timeout: cfg.StoreTimeout,
	}
	e.completer = newCompleter(e.store, e.timeout)
	e.claimer = newClaimer(e.store, e.timeout)
	e.completeBy.d = e.timeout
	e.settleBy.d = settleTimeout
	return e, nil
}

// Close waits for the engine's background completions to finish. Call it
// after the Worker's Run returned; the Store is closed by its owner.
func (e *Engine) Close() error {
	e.completer.wait()
	e.claimer.wait()
	return nil
}

// Processor returns what makes the deduplicating consumer.Processor of a
// handler with opts (consumer.WithProcessor). It fails, naming the option,
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
			e:        e,
			name:     name,
			h:        next,
			cfg:      cfg,
			log:      e.log.With("handler", name),
			prepared: make(map[consumer.Delivery]*prepared),
			held:     make(map[string]*prepared),
			renewals: renewals{tick: max(cfg.lease/100, time.Millisecond)},
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

	renewals renewals

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
	claimAt time.Time // local time the claim was requested
}

// settleTimeout bounds an ack, nak or dead-letter publish.
const settleTimeout = 10 * time.Second

// maxClaimRounds bounds re-claims after an in-flight key was released.
const maxClaimRounds = 3

// leaseSlack is added to a foreign lease's end before claiming it again, for
// the distance between this clock and the store's.
const leaseSlack = 50 * time.Millisecond

func (p *processor) inspect(d consumer.Delivery) *prepared {
	m := d.Message()
	pr := &prepared{fp: Fingerprint(m, p.cfg.fpHeaders)}
	key, _, err := ExtractKey(m, p.cfg.keySources, pr.fp)
	if err != nil {
		p.log.Warn("key extraction failed; treating as missing key", "origin", m.Origin.String(), "err", err)
	}
	if key != "" {
		pr.key = key
		pr.ekey = EffectiveKey(p.name, key)
	}
	return pr
}

// Prepare claims the keys of a fetched batch in one store call
// (SPEC §4.4). A key that appears twice in the batch is claimed for its first
// delivery only; the later one claims when it runs and finds the key in
// flight or done.
func (p *processor) Prepare(ctx context.Context, batch []consumer.Delivery) {
	prs := make([]*prepared, len(batch))
	reqs := make([]ClaimRequest, 0, len(batch))
	idx := make([]int, 0, len(batch))
	seen := make(map[string]struct{}, len(batch))
	for i, d := range batch {
		pr := p.inspect(d)
		prs[i] = pr
		if pr.key == "" || ctx.Err() != nil {
			continue
		}
		if _, dup := seen[pr.ekey]; dup {
			continue
		}
		seen[pr.ekey] = struct{}{}
		reqs = append(reqs, p.claimRequest(pr))
		idx = append(idx, i)
	}
	if len(reqs) > 0 {
		now := time.Now()
		res, err := p.claim(ctx, reqs)
		for j, i := range idx {
			pr := prs[i]
			pr.claimed, pr.claimAt, pr.err, pr.batched = true, now, err, true
			if err == nil {
				pr.res = res[j]
			}
		}
	}
	p.mu.Lock()
	for i, d := range batch {
		pr := prs[i]
		p.prepared[d] = pr
		if pr.claimed && pr.err == nil && pr.res.Outcome.Owned() {
			p.held[pr.ekey] = pr
		}
	}
	p.mu.Unlock()
}

func (p *processor) claimRequest(pr *prepared) ClaimRequest {
	return ClaimRequest{Key: pr.ekey, Fingerprint: pr.fp, FingerprintVersion: FingerprintVersion, Lease: p.cfg.lease, Retention: p.cfg.retention}
}

func (p *processor) claim(ctx context.Context, reqs []ClaimRequest) ([]ClaimResult, error) {
	cctx, cancel := context.WithTimeout(ctx, p.e.timeout)
	defer cancel()
	res, err := p.e.store.Claim(cctx, reqs)
	if err == nil && len(res) != len(reqs) {
		err = fmt.Errorf("%w: claim returned %d results for %d keys", ErrStoreUnavailable, len(res), len(reqs))
	}
	return res, err
}

func (p *processor) take(d consumer.Delivery) *prepared {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.prepared[d]
	if ok {
		delete(p.prepared, d)
		if p.held[pr.ekey] == pr {
			delete(p.held, pr.ekey)
		}
	}
	return pr
}

// adopt moves a held claim of pr's key, made for a delivery that has not
// started, to pr. That delivery will claim afresh when it runs, and find the
// key done. It reports whether there was one.
func (p *processor) adopt(pr *prepared) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.held[pr.ekey]
	if !ok || h == pr {
		return false
	}
	delete(p.held, pr.ekey)
	pr.claimed, pr.res, pr.err, pr.claimAt = true, h.res, nil, h.claimAt
	h.claimed, h.res = false, ClaimResult{}
	return true
}

// Process takes one delivery through SPEC §5–§7.
func (p *processor) Process(ctx context.Context, d consumer.Delivery) {
	pr := p.take(d)
	if pr == nil {
		pr = p.inspect(d)
	}
	p.process(ctx, d, pr)
}

// process takes d, whose prepared state pr was taken, through SPEC §5–§7
// on its own.
func (p *processor) process(ctx context.Context, d consumer.Delivery, pr *prepared) {
	if ctx.Err() != nil {
		p.abandon(ctx, d, pr)
		return
	}
	if pr.key == "" {
		p.missingKey(ctx, d)
		return
	}
	if o := consumer.ObservationFrom(ctx); o != nil {
		o.KeyHash = keyHash(pr.ekey)
	}
	for round := 0; ; round++ {
		if !pr.claimed || pr.res.Outcome == ClaimInFlight {
			p.adopt(pr)
		}
		if !pr.claimed {
			pr.claimAt = time.Now()
			cctx, cancel := context.WithTimeout(ctx, p.e.timeout)
			res, err := p.e.claimer.do(cctx, p.claimRequest(pr))
			cancel()
			pr.claimed, pr.err, pr.res = true, err, res
		}
		if pr.err != nil {
			p.storeDown(ctx, d, "claim", pr.err)
			return
		}
		res := pr.res
		switch res.Outcome {
		case ClaimNew, ClaimReclaimed, ClaimRecovered:
			if !p.runOwned(ctx, d, pr) {
				pr.claimed = false // the claim went stale before the run: claim again
				if round < maxClaimRounds {
					continue
				}
				p.inFlight(ctx, d, pr)
			}
			return
		case ClaimDuplicate:
			p.duplicate(ctx, d, res.Record)
			return
		case ClaimMismatch:
			p.mismatch(ctx, d, pr, res.Record)
			return
		case ClaimInFlight:
			if pr.batched && !p.cfg.shadow {
				// The batch claim found the key in flight, perhaps long
				// ago: claim again before waiting, which costs one round
				// trip where the wait's read and the claim after it cost
				// two. Not a round of its own.
				pr.claimed, pr.batched = false, false
				round--
				continue
			}
			if p.cfg.shadow {
				p.runUnclaimed(ctx, d, pr.key, consumer.OutcomeWouldSkip)
				return
			}
			if round >= maxClaimRounds {
				p.inFlight(ctx, d, pr)
				return
			}
			rec, err := p.waitInFlight(ctx, d, pr.ekey, res.Record)
			switch {
			case ctx.Err() != nil:
				p.abandon(ctx, d, &prepared{})
				return
			case err != nil:
				p.storeDown(ctx, d, "inflight", err)
				return
			case rec != nil:
				p.inFlight(ctx, d, pr)
				return
			}
			pr.claimed = false // completed, released or gone: the claim decides
		default:
			p.storeDown(ctx, d, "claim", fmt.Errorf("%w: unknown claim outcome %q", ErrStoreUnavailable, res.Outcome))
			return
		}
	}
}

// waitInFlight waits up to the in-flight wait for the owner of key to
// finish (SPEC §5.1). It returns nil when the key should be claimed again
// (completed, released, gone, or its owner's lease ran out: a crashed worker
// is reclaimed as soon as its lease ends, not after the whole wait), or the
// record still in flight when the wait is over.
//
// While it waits it heartbeats d every third of the lease (with jitter),
// the cadence of a running handler's renewals: a wait can be as long as the
// lease, and NATS redelivers a message not heartbeated within AckWait
// (which defaults to the lease).
func (p *processor) waitInFlight(ctx context.Context, d consumer.Delivery, key string, rec *Record) (*Record, error) {
	deadline := time.Now().Add(p.cfg.inFlightWait)
	beatEvery := p.cfg.lease / 3
	nextBeat := time.Now().Add(jitter(beatEvery))
	for {
		wait := time.Until(deadline)
		if rec != nil && !rec.LeaseUntil.IsZero() {
			// LeaseUntil is on the store's clock: it only shortens the
			// wait; the claim script decides.
			wait = min(wait, time.Until(rec.LeaseUntil)+leaseSlack)
		}
		if wait <= 0 {
			if time.Now().Before(deadline) {
				return nil, nil // the lease ran out: claim now
			}
			return rec, nil
		}
		if beatEvery > 0 {
			if !time.Now().Before(nextBeat) {
				p.heartbeat(ctx, d)
				nextBeat = time.Now().Add(jitter(beatEvery))
			}
			wait = min(wait, time.Until(nextBeat))
		}
		wctx, cancel := context.WithTimeout(ctx, wait+p.e.timeout)
		got, err := p.e.store.Wait(wctx, key, wait)
		cancel()
		if err != nil {
			return nil, err
		}
		if got == nil || got.State != StateClaimed || got.Released {
			return nil, nil
		}
		rec = got // still claimed: renewed (wait on) or expired (claim)
	}
}

// heartbeat tells the transport that d is still being worked on, within a
// third of the lease or the store timeout; a failure is logged, not
// returned: the next heartbeat may succeed, and a redelivery is a duplicate
// the claim catches.
func (p *processor) heartbeat(ctx context.Context, d consumer.Delivery) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(p.cfg.lease/3, p.e.timeout))
	defer cancel()
	if err := d.Heartbeat(hctx); err != nil {
		p.log.Warn("transport heartbeat failed", "err", err)
	}
}

// runOwned runs the handler under an owned claim. It returns false, having
// done nothing, when a claim prepared earlier turned out to be lost before
// the handler started.
func (p *processor) runOwned(ctx context.Context, d consumer.Delivery, pr *prepared) bool {
	leaseEnd, st := p.ready(ctx, d, pr)
	switch st {
	case claimLost:
		return false
	case claimSettled:
		return true
	}
	run, hctx := p.start(ctx, d, pr, leaseEnd)
	start := time.Now()
	result, herr := consumer.CallHandler(hctx, p.h, d.Message())
	took := time.Since(start)
	run.renewer.stop()
	if c, ok := p.outcome(ctx, d, pr, run, hctx, result, herr, took, true); ok {
		p.completeOne(ctx, c)
	}
	run.cancel(nil)
	return true
}

// readiness is what ready found of an owned claim.
type readiness int

const (
	claimReady   readiness = iota // run the handler
	claimLost                     // the claim went stale: claim again
	claimSettled                  // the delivery was settled without running
)

// ready checks an owned claim before its handler runs: it refreshes a claim
// that waited (for a concurrency slot, or behind earlier messages of its
// partition), and dead-letters a key that used up its runs. It returns the
// claim's lease end.
func (p *processor) ready(ctx context.Context, d consumer.Delivery, pr *prepared) (time.Time, readiness) {
	res := pr.res
	cl := res.Claim
	leaseEnd := pr.claimAt.Add(p.cfg.lease)
	if time.Since(pr.claimAt) > p.cfg.lease/3 {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, p.e.timeout)
		_, ok, err := p.e.store.Renew(rctx, cl.Key, cl.Token, p.cfg.lease)
		cancel()
		if err != nil {
			p.storeDown(ctx, d, "renew", err)
			return leaseEnd, claimSettled
		}
		if !ok {
			return leaseEnd, claimLost
		}
		leaseEnd = start.Add(p.cfg.lease)
	}
	if res.Outcome == ClaimRecovered {
		p.e.hooks.CorruptRecord(p.name)
		p.log.Warn("stored value was not a valid record; replaced by a fresh claim", "key_hash", keyHash(pr.ekey))
	}
	if cl.Attempts > p.cfg.maxAttempts {
		// The key has had its max_attempts runs, and the last of them
		// ended with no outcome stored (its worker died, or it lost its
		// lease): an error would have dead-lettered it. The attempts are
		// counted in the record, across restarts (SPEC §7.2, §11.3), so a
		// key that kills its worker on every run stops here instead of
		// running for ever.
		runs := cl.Attempts - 1
		err := fmt.Errorf("dedup: the key had %d runs (max_attempts %d) and the last ended without an outcome: its worker stopped or lost the lease during it", runs, p.cfg.maxAttempts)
		if c, ok := p.deadLetterOwned(ctx, d, cl, pr.key, "max_attempts", err, runs); ok {
			p.completeOne(ctx, c)
		}
		return leaseEnd, claimSettled
	}
	return leaseEnd, claimReady
}

// start prepares one handler run under pr's owned claim: the context that
// carries the claim (FromContext, Step) and ends when the claim is lost, and
// the lease renewals, which run until run.renewer.stop. The caller cancels
// the context with run.cancel once the run's outcome is settled.
func (p *processor) start(ctx context.Context, d consumer.Delivery, pr *prepared, leaseEnd time.Time) (*handlerRun, context.Context) {
	cl := pr.res.Claim
	run := &handlerRun{Context: ctx}
	run.rs = runState{
		info: ClaimInfo{
			Handler: p.name, Key: pr.key, EffectiveKey: cl.Key, Fence: cl.Fence,
			Attempt: max(cl.Attempts, 1), Reclaimed: pr.res.Outcome == ClaimReclaimed,
		},
		store: p.e.store,
		token: cl.Token,
		steps: cl.Steps,
	}
	hctx, cancel := context.WithCancelCause(run)
	run.cancel = cancel
	p.renew(&run.renewer, hctx, cancel, d, cl, leaseEnd)
	return run, hctx
}

// outcome decides the fate of d after its handler ran under run's claim
// and returned result and herr (SPEC §5.2, §7): a success or a dead-letter
// returns the completion still to be stored and true (the caller stores it,
// with those of the rest of its run, and settles it in complete); a lost
// claim, a cancellation or a retry is settled here and returns false.
// observe says whether ctx's Observation belongs to d alone.
func (p *processor) outcome(ctx context.Context, d consumer.Delivery, pr *prepared, run *handlerRun, hctx context.Context, result []byte, herr error, took time.Duration, observe bool) (completing, bool) {
	cl := pr.res.Claim
	m := d.Message()
	rs := &run.rs
	p.e.hooks.HandlerDone(p.name, took, herr)
	if o := consumer.ObservationFrom(ctx); o != nil && observe {
		o.Fence, o.Attempt, o.Err = cl.Fence, rs.info.Attempt, herr
	}

	if errors.Is(context.Cause(hctx), ErrLeaseLost) {
		p.log.Warn("claim lost while the handler ran; its result is discarded and the new owner finishes the key",
			"origin", m.Origin.String(), "fence", cl.Fence, "took", took)
		p.settle(ctx, d, consumer.OutcomeLeaseLost, p.afterLoss(ctx, d, cl))
		return completing{}, false
	}
	if herr == nil {
		outcome := consumer.OutcomeProcessed
		if pr.res.Outcome == ClaimReclaimed {
			outcome = consumer.OutcomeReclaimed
		}
		return p.completion(d, cl, RecordOutcomeOK, result, nil, outcome), true
	}
	if ctx.Err() != nil {
		p.log.Info("handler cancelled; claim released for redelivery", "origin", m.Origin.String(), "cause", context.Cause(ctx))
		p.release(ctx, cl)
		p.settle(ctx, d, consumer.OutcomeCancelled, nak(0))
		return completing{}, false
	}
	var pe *consumer.PanicError
	if errors.As(herr, &pe) {
		p.log.Error("handler panicked", "origin", m.Origin.String(), "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
	}
	attempt := rs.info.Attempt
	permanent := consumer.IsPermanent(herr)
	if permanent || attempt >= p.cfg.maxAttempts {
		reason := "max_attempts"
		if permanent {
			reason = "permanent_error"
		}
		return p.deadLetterOwned(ctx, d, cl, pr.key, reason, herr, attempt)
	}
	delay, ok := consumer.RetryDelay(herr)
	if !ok {
		delay = consumer.Backoff(attempt, p.cfg.backoffInitial, p.cfg.backoffMax)
	}
	p.log.Warn("handler failed; released for retry", "origin", m.Origin.String(), "attempt", attempt,
		"max_attempts", p.cfg.maxAttempts, "delay", delay, "err", herr)
	p.release(ctx, cl)
	p.settle(ctx, d, consumer.OutcomeFailed, nak(delay))
	return completing{}, false
}

// renew starts r: it renews the lease every third of it (with jitter) and
// heartbeats the transport, until r.stop is called (SPEC §6). When the claim is
// lost, or renewals fail until the lease is about to run out, it cancels the
// handler with ErrLeaseLost.
//
// It is neither a goroutine nor a timer per run: most handlers finish long
// before the first renewal, and a goroutine, two channels and a timer per
// delivery, then a timer and its closures per delivery, were a measurable
// share of the worker's CPU (docs/PERFORMANCE.md). The processor's renewals
// list holds the running handlers, and one timer looks for renewals due.
func (p *processor) renew(r *renewer, hctx context.Context, cancel context.CancelCauseFunc, d consumer.Delivery, cl *Claim, leaseEnd time.Time) {
	r.p, r.hctx, r.cancel, r.d, r.cl, r.leaseEnd = p, hctx, cancel, d, cl, leaseEnd
	p.renewals.add(r, time.Now().Add(jitter(p.cfg.lease/3)))
}

// handlerRun is what one run of the handler under a claim needs besides
// its cancellable context, in one allocation: the context's value (the
// runState that FromContext and Step find) and the lease renewer.
type handlerRun struct {
	context.Context // the delivery's
	rs              runState
	renewer         renewer
	cancel          context.CancelCauseFunc // the handler context's
}

// Value returns the run's state for ctxKey, else the delivery context's
// value.
func (r *handlerRun) Value(key any) any {
	if _, ok := key.(ctxKey); ok {
		return &r.rs
	}
	return r.Context.Value(key)
}

// renewals are the lease renewals of one processor's running handlers: a
// list, and one timer that, while the list is not empty, looks every tick
// for renewals due and runs each on a goroutine of its own. A renewal is
// late by at most a tick (a hundredth of the lease).
type renewals struct {
	tick time.Duration

	mu         sync.Mutex
	head, tail *renewer
	timer      *time.Timer // nil until the first run; armed while head != nil
	armed      bool
}

// renewer is the state of one handler run's lease renewals.
type renewer struct {
	p        *processor
	hctx     context.Context
	cancel   context.CancelCauseFunc
	d        consumer.Delivery
	cl       *Claim
	leaseEnd time.Time // only fire touches it; fires never overlap

	// Guarded by p.renewals.mu:
	prev, next *renewer
	listed     bool      // in the list: not stopped, not over
	due        time.Time // when to renew next
	firing     bool      // a fire is running or about to
	busy       sync.WaitGroup
}

func (s *renewals) add(r *renewer, due time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.due, r.listed = due, true
	r.prev, r.next = s.tail, nil
	if s.tail != nil {
		s.tail.next = r
	} else {
		s.head = r
	}
	s.tail = r
	if s.armed {
		return
	}
	s.armed = true
	if s.timer == nil {
		s.timer = time.AfterFunc(s.tick, s.scan)
	} else {
		s.timer.Reset(s.tick)
	}
}

// unlink takes r off the list; s.mu is held.
func (s *renewals) unlink(r *renewer) {
	if !r.listed {
		return
	}
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		s.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		s.tail = r.prev
	}
	r.prev, r.next, r.listed = nil, nil, false
}

// scan starts the renewals that are due, and arms the timer again while
// handlers run.
func (s *renewals) scan() {
	now := time.Now()
	var due []*renewer
	s.mu.Lock()
	for r := s.head; r != nil; r = r.next {
		if !r.firing && !r.due.After(now) {
			r.firing = true
			r.busy.Add(1)
			due = append(due, r)
		}
	}
	if s.head != nil {
		s.timer.Reset(s.tick)
	} else {
		s.armed = false
	}
	s.mu.Unlock()
	for _, r := range due {
		go r.fire()
	}
}

// stop ends the renewals and waits for one in progress: nothing is renewed,
// heartbeated or cancelled after it returns.
func (r *renewer) stop() {
	s := &r.p.renewals
	s.mu.Lock()
	s.unlink(r)
	s.mu.Unlock()
	r.busy.Wait()
}

// fire renews once, then sets when to renew next unless the renewer was
// stopped, the handler ended or the claim was lost.
func (r *renewer) fire() {
	defer r.busy.Done()
	s := &r.p.renewals
	s.mu.Lock()
	stopped := !r.listed
	s.mu.Unlock()
	var (
		next  time.Duration
		again bool
	)
	if !stopped && r.hctx.Err() == nil {
		next, again = r.once()
	}
	s.mu.Lock()
	r.firing = false
	if again {
		r.due = time.Now().Add(next)
	} else {
		s.unlink(r)
	}
	s.mu.Unlock()
}

// once makes one renewal and heartbeat; it returns when to renew next, or
// false when renewals are over.
func (r *renewer) once() (time.Duration, bool) {
	p, hctx := r.p, r.hctx
	lease := p.cfg.lease
	interval := lease / 3
	start := time.Now()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(hctx), min(lease/3, p.e.timeout))
	_, ok, err := p.e.store.Renew(rctx, r.cl.Key, r.cl.Token, lease)
	rcancel()
	switch {
	case err != nil:
		p.e.hooks.LeaseRenewal(p.name, "error")
		if time.Now().Add(lease / 10).After(r.leaseEnd) {
			p.log.Error("lease renewals failed until the lease ran out; cancelling the handler", "err", err)
			r.cancel(ErrLeaseLost)
			return 0, false
		}
		p.log.Warn("lease renewal failed; retrying", "err", err)
		return jitter(max(interval/4, 10*time.Millisecond)), true
	case !ok:
		p.e.hooks.LeaseRenewal(p.name, "lost")
		r.cancel(ErrLeaseLost)
		return 0, false
	}
	p.e.hooks.LeaseRenewal(p.name, "ok")
	r.leaseEnd = start.Add(lease)
	p.heartbeat(hctx, r.d)
	return jitter(interval), true
}

// jitter returns d ±10 %.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/10 + time.Duration(rand.Int64N(int64(d)/5+1))
}

// completing is an outcome to store before its delivery is acked
// (SPEC §5.2).
type completing struct {
	d       consumer.Delivery
	cl      *Claim
	c       Completion
	outcome consumer.Outcome
	// ctx is the delivery's own context in a run whose deliveries have
	// one each (consumer.DeliveryContext), nil otherwise: it is settled,
	// and its outcome observed, on it.
	ctx context.Context
}

func (p *processor) completion(d consumer.Delivery, cl *Claim, recOutcome string, result []byte, meta map[string]string, outcome consumer.Outcome) completing {
	return completing{
		d: d, cl: cl, outcome: outcome,
		c: Completion{Key: cl.Key, Token: cl.Token, Outcome: recOutcome, Result: result, Meta: meta, Retention: p.cfg.retention},
	}
}

// completeAttempts is how many times complete tries to store a completion.
const completeAttempts = 3

// completeOne is complete for one delivery, without allocating.
func (p *processor) completeOne(ctx context.Context, c completing) {
	cs := [1]completing{c}
	var (
		owned [1]bool
		errs  [1]error
		todo  = [1]int{0}
	)
	p.completeInto(ctx, cs[:], owned[:], errs[:], todo[:])
}

// complete stores the outcomes of cs, submitted together so that one store
// call carries a whole run's (SPEC §4.4), then settles each delivery: acked
// once its outcome is stored, redelivered when it could not be, settled as a
// lost claim when another owner holds its key.
func (p *processor) complete(ctx context.Context, cs []completing) {
	todo := make([]int, len(cs))
	for i := range cs {
		todo[i] = i
	}
	p.completeInto(ctx, cs, make([]bool, len(cs)), make([]error, len(cs)), todo)
}

// completeInto is complete with its working space: owned and errs of
// len(cs), todo holding every index of cs.
func (p *processor) completeInto(ctx context.Context, cs []completing, owned []bool, errs []error, todo []int) {
	// The work is done: try hard to record it before giving up, since a
	// redelivery would run it again once the lease expires.
	for attempt, wait := 0, 100*time.Millisecond; len(todo) > 0 && attempt < completeAttempts; attempt, wait = attempt+1, wait*3 {
		if attempt > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		// The completer reads no values and the delivery's cancellation
		// must not stop it: a deadline shared with the other deliveries.
		if len(todo) == 1 {
			i := todo[0]
			owned[i], errs[i] = p.e.completer.do(p.e.completeBy.ctx(), cs[i].c)
		} else {
			reqs := make([]Completion, len(todo))
			for j, i := range todo {
				reqs[j] = cs[i].c
			}
			res, rerrs := p.e.completer.doAll(p.e.completeBy.ctx(), reqs)
			for j, i := range todo {
				owned[i], errs[i] = res[j], rerrs[j]
			}
		}
		failed := todo[:0]
		for _, i := range todo {
			if errs[i] != nil {
				failed = append(failed, i)
			}
		}
		todo = failed
	}
	for i, c := range cs {
		d := c.d
		ctx := ctx
		if c.ctx != nil {
			ctx = c.ctx
		}
		switch {
		case errs[i] != nil:
			p.log.Error("handler finished but its completion could not be stored; not acked, the message will be redelivered",
				"origin", d.Message().Origin.String(), "err", errs[i])
			p.settle(ctx, d, consumer.OutcomeStoreError, nak(consumer.Backoff(d.Attempt(), p.cfg.storeRetryMin, p.cfg.storeRetryMax)))
		case !owned[i]:
			p.log.Warn("claim lost before completion; the new owner finishes the key", "origin", d.Message().Origin.String(), "fence", c.cl.Fence)
			p.settle(ctx, d, consumer.OutcomeLeaseLost, p.afterLoss(ctx, d, c.cl))
		default:
			p.settle(ctx, d, c.outcome, ack)
		}
	}
}

// deadLetterOwned publishes d to the dead-letter destination and returns the
// dead_lettered completion to store and true; when publishing failed it
// releases the claim, naks d for a retry and returns false.
func (p *processor) deadLetterOwned(ctx context.Context, d consumer.Delivery, cl *Claim, key, reason string, herr error, attempt int) (completing, bool) {
	m := d.Message()
	dl := consumer.DeadLetter{Reason: reason, Err: herr.Error(), Key: key, Handler: p.name, Attempts: attempt}
	if !p.publishDeadLetter(ctx, d, dl) {
		p.release(ctx, cl)
		p.settle(ctx, d, consumer.OutcomeFailed, nak(consumer.Backoff(attempt, p.cfg.backoffInitial, p.cfg.backoffMax)))
		return completing{}, false
	}
	p.log.Error("message dead-lettered", "origin", m.Origin.String(), "reason", reason, "attempts", attempt, "err", herr)
	meta := map[string]string{"reason": reason, "error": truncate(herr.Error(), 1024)}
	return p.completion(d, cl, RecordOutcomeDeadLettered, nil, meta, consumer.OutcomeDeadLettered), true
}

// publishDeadLetter sends dl and reports whether the message may now be
// acked: true when published, or when there is no destination (logged: the
// record still says dead_lettered, SPEC §7.2); false when publishing failed.
func (p *processor) publishDeadLetter(ctx context.Context, d consumer.Delivery, dl consumer.DeadLetter) bool {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	err := d.DeadLetter(dctx, dl)
	switch {
	case err == nil:
		return true
	case errors.Is(err, consumer.ErrNoDeadLetter):
		p.log.Error("no dead-letter destination configured: the message is recorded as dead-lettered and acked",
			"origin", d.Message().Origin.String(), "reason", dl.Reason, "err", dl.Err)
		return true
	}
	p.log.Error("dead-letter publish failed; will retry", "origin", d.Message().Origin.String(), "reason", dl.Reason, "err", err)
	return false
}

func (p *processor) release(ctx context.Context, cl *Claim) {
	keep := min(p.cfg.retention, 2*p.cfg.backoffMax+p.cfg.lease)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.e.timeout)
	defer cancel()
	if _, err := p.e.store.Release(rctx, cl.Key, cl.Token, keep); err != nil {
		p.log.Warn("releasing claim failed; it frees itself when its lease expires", "lease", p.cfg.lease, "err", err)
	}
}

func (p *processor) duplicate(ctx context.Context, d consumer.Delivery, rec *Record) {
	if p.cfg.shadow {
		p.runUnclaimed(ctx, d, "", consumer.OutcomeWouldSkip)
		return
	}
	if p.cfg.onDuplicate != nil && rec != nil {
		hctx, cancel := context.WithTimeout(ctx, settleTimeout)
		err := p.cfg.onDuplicate(hctx, d, rec)
		cancel()
		if err != nil {
			p.log.Warn("OnDuplicate hook failed", "origin", d.Message().Origin.String(), "err", err)
		}
	}
	p.settle(ctx, d, consumer.OutcomeDuplicate, ack)
}

func (p *processor) mismatch(ctx context.Context, d consumer.Delivery, pr *prepared, rec *Record) {
	if p.cfg.mismatch == MismatchIgnore {
		p.duplicate(ctx, d, rec)
		return
	}
	if p.cfg.shadow {
		p.runUnclaimed(ctx, d, pr.key, consumer.OutcomeWouldSkip)
		return
	}
	p.log.Warn("idempotency key reused for different content; rejected", "origin", d.Message().Origin.String(), "key_hash", keyHash(pr.ekey))
	dl := consumer.DeadLetter{Reason: "fingerprint_mismatch", Err: "payload fingerprint differs from the stored record's", Key: pr.key, Handler: p.name}
	if !p.publishDeadLetter(ctx, d, dl) {
		p.settle(ctx, d, consumer.OutcomeFailed, nak(consumer.Backoff(d.Attempt(), p.cfg.backoffInitial, p.cfg.backoffMax)))
		return
	}
	p.settle(ctx, d, consumer.OutcomeMismatch, ack)
}

func (p *processor) missingKey(ctx context.Context, d consumer.Delivery) {
	if p.cfg.missingKey == MissingKeyPassthrough {
		p.runUnclaimed(ctx, d, "", consumer.OutcomePassthrough)
		return
	}
	dl := consumer.DeadLetter{Reason: "missing_key", Err: "no idempotency key from " + sourcesString(p.cfg.keySources), Handler: p.name}
	if !p.publishDeadLetter(ctx, d, dl) {
		p.settle(ctx, d, consumer.OutcomeFailed, nak(consumer.Backoff(d.Attempt(), p.cfg.backoffInitial, p.cfg.backoffMax)))
		return
	}
	p.settle(ctx, d, consumer.OutcomeMissingKey, ack)
}

func (p *processor) inFlight(ctx context.Context, d consumer.Delivery, pr *prepared) {
	delay := consumer.Backoff(d.Attempt(), p.cfg.backoffInitial, max(p.cfg.backoffInitial, p.cfg.lease))
	p.log.Info("key in flight elsewhere; redelivering later", "origin", d.Message().Origin.String(), "key_hash", keyHash(pr.ekey), "delay", delay)
	p.settle(ctx, d, consumer.OutcomeInFlight, nak(delay))
}

// storeDown handles an unavailable store (SPEC §7.3): fail-closed by default.
func (p *processor) storeDown(ctx context.Context, d consumer.Delivery, op string, err error) {
	if ctx.Err() != nil {
		p.abandon(ctx, d, &prepared{})
		return
	}
	if p.cfg.failOpen {
		p.log.Warn("store unavailable; running without deduplication (fail_open)", "op", op, "err", err)
		p.runUnclaimed(ctx, d, "", consumer.OutcomeStoreBypassed)
		return
	}
	delay := consumer.Backoff(d.Attempt(), p.cfg.storeRetryMin, p.cfg.storeRetryMax)
	p.log.Warn("store unavailable; not running, not acking, retrying", "op", op, "delay", delay, "err", err)
	p.settle(ctx, d, consumer.OutcomeStoreError, nak(delay))
}

// runUnclaimed runs the handler without a claim (passthrough, fail-open,
// shadow duplicates): ack on success, retry or dead-letter on failure.
func (p *processor) runUnclaimed(ctx context.Context, d consumer.Delivery, key string, outcome consumer.Outcome) {
	m := d.Message()
	// The handler's context ends when it returns (the Runner may share the
	// delivery's context between deliveries).
	hctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	_, herr := consumer.CallHandler(hctx, p.h, m)
	cancel()
	p.e.hooks.HandlerDone(p.name, time.Since(start), herr)
	switch {
	case herr == nil:
		p.settle(ctx, d, outcome, ack)
	case ctx.Err() != nil:
		p.settle(ctx, d, consumer.OutcomeCancelled, nak(0))
	case consumer.IsPermanent(herr) || d.Attempt() >= p.cfg.maxAttempts:
		reason := "max_attempts"
		if consumer.IsPermanent(herr) {
			reason = "permanent_error"
		}
		dl := consumer.DeadLetter{Reason: reason, Err: herr.Error(), Key: key, Handler: p.name, Attempts: d.Attempt()}
		if !p.publishDeadLetter(ctx, d, dl) {
			p.settle(ctx, d, consumer.OutcomeFailed, nak(consumer.Backoff(d.Attempt(), p.cfg.backoffInitial, p.cfg.backoffMax)))
			return
		}
		p.settle(ctx, d, consumer.OutcomeDeadLettered, ack)
	default:
		delay, ok := consumer.RetryDelay(herr)
		if !ok {
			delay = consumer.Backoff(d.Attempt(), p.cfg.backoffInitial, p.cfg.backoffMax)
		}
		p.log.Warn("handler failed; will retry", "origin", m.Origin.String(), "attempt", d.Attempt(), "delay", delay, "err", herr)
		p.settle(ctx, d, consumer.OutcomeFailed, nak(delay))
	}
}

// abandon settles a delivery that will not run because ctx is cancelled:
// release a claim made for it and ask for redelivery at once.
func (p *processor) abandon(ctx context.Context, d consumer.Delivery, pr *prepared) {
	if pr.claimed && pr.err == nil && pr.res.Outcome.Owned() {
		p.release(ctx, pr.res.Claim)
	}
	p.settle(ctx, d, consumer.OutcomeCancelled, nak(0))
}

type settleFunc func(ctx context.Context, d consumer.Delivery) error

// afterLoss settles a delivery whose claim was lost: acked when the record
// shows a new owner (claimed under another token) or a completion, who
// finishes the key (SPEC §5.2); otherwise redelivered after the store
// backoff. A record that is gone (Redis restarted without its data), or a
// store that cannot say, has no new owner: acking would lose the message.
func (p *processor) afterLoss(ctx context.Context, d consumer.Delivery, cl *Claim) settleFunc {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.e.timeout)
	rec, err := p.e.store.Get(gctx, cl.Key)
	cancel()
	if err == nil && rec != nil && (rec.State == StateCompleted || rec.Token != cl.Token && !rec.Released) {
		return ack
	}
	p.log.Warn("no new owner holds the key of a lost claim; redelivering", "origin", d.Message().Origin.String(), "fence", cl.Fence, "err", err)
	return nak(consumer.Backoff(d.Attempt(), p.cfg.storeRetryMin, p.cfg.storeRetryMax))
}

func ack(ctx context.Context, d consumer.Delivery) error { return d.Ack(ctx) }

func nak(delay time.Duration) settleFunc {
	return func(ctx context.Context, d consumer.Delivery) error { return d.Nak(ctx, delay) }
}

// settle acks or naks with its own deadline (it must work during shutdown,
// when ctx is cancelled) and reports the outcome.
func (p *processor) settle(ctx context.Context, d consumer.Delivery, outcome consumer.Outcome, f settleFunc) {
	values := ctx
	if ctx.Done() != nil {
		// Hide its cancellation (a context that can never be cancelled,
		// as the sources' shared delivery context, has none to hide).
		values = context.WithoutCancel(ctx)
	}
	sctx := &valuesCtx{Context: p.e.settleBy.ctx(), values: values}
	if err := f(sctx, d); err != nil {
		p.log.Error("settling the delivery failed; the broker will redeliver it", "origin", d.Message().Origin.String(), "outcome", string(outcome), "err", err)
	}
	p.e.hooks.Outcome(p.name, d.Message().Origin.Transport, outcome)
	if o := consumer.ObservationFrom(ctx); o != nil {
		o.Outcome = outcome
	}
}

// deadlines hands out contexts that end between d and d+d/8 from now, one
// shared by every call made within d/8, so an ack or a completion allocates
// no context and starts no timer of its own (BenchmarkEngine's allocs/op
// guards it); Acks and Naks (NATS without AckSync, Kafka) do not even look
// at their context. A context is never cancelled before its deadline.
// The zero value is not usable: set d.
type deadlines struct {
	d   time.Duration
	cur atomic.Pointer[deadline]
	mu  sync.Mutex // held while a new context is made
}

type deadline struct {
	ctx context.Context
	at  time.Time // ctx's deadline (with a monotonic reading)
	// cancel is never called: the context ends at its deadline, when its
	// timer releases it, and not before, since calls may still use it.
	cancel context.CancelFunc
}

// ctx returns a context without values that ends between d and d+d/8 from
// now.
func (s *deadlines) ctx() context.Context {
	now := time.Now()
	if c := s.cur.Load(); c != nil && c.at.Sub(now) >= s.d {
		return c.ctx
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.cur.Load(); c != nil && c.at.Sub(now) >= s.d {
		return c.ctx
	}
	at := now.Add(s.d + s.d/8)
	ctx, cancel := context.WithDeadline(context.Background(), at)
	s.cur.Store(&deadline{ctx: ctx, at: at, cancel: cancel})
	return ctx
}

// valuesCtx has the values of one context and the deadline and
// cancellation of another.
type valuesCtx struct {
	context.Context                 // deadline, cancellation and its cause
	values          context.Context // values; its Done must be nil (context.WithoutCancel)
}

// Value looks in values first. Having no cancellation of its own to show
// (WithoutCancel hides it), values lets context.Cause and derived contexts
// find the deadline context's.
func (c *valuesCtx) Value(key any) any {
	if v := c.values.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}
