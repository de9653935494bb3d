package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Source consumes a JetStream durable pull consumer for one handler. It
// implements consumer.Source. One Source feeds one registered handler; a
// second concurrent Consume fails.
type Source struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger

	consuming atomic.Bool

	dlMu   sync.Mutex
	dlMode dlMode
}

type dlMode int

const (
	dlUnknown dlMode = iota // not resolved yet
	dlStream                // a stream captures the subject: JetStream publish
	dlCore                  // no stream: core publish and flush
)

var _ consumer.Source = (*Source)(nil)

// New returns a Source reading cfg.Consumer of cfg.Stream through js. It
// validates cfg (errors wrap ErrInvalidConfig and name the field) and makes
// no network call: the consumer is bound or created when Consume starts,
// because its MaxAckPending follows the handler's concurrency.
func New(js jetstream.JetStream, cfg Config) (*Source, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: jetstream.JetStream is nil", ErrInvalidConfig)
	}
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Source{
		js:  js,
		cfg: cfg,
		log: cfg.Logger.With("stream", cfg.Stream, "consumer", cfg.Consumer),
	}, nil
}

// Config returns the Source's configuration with defaults filled in.
func (s *Source) Config() Config { return s.cfg }

// Reply answers m's requester (see the package-level Reply) on the Source's
// connection.
func (s *Source) Reply(ctx context.Context, m *consumer.Message, data []byte) error {
	return Reply(ctx, s.js.Conn(), m, data)
}

// Consume binds to (or creates) the durable consumer and runs its messages on
// r until ctx is cancelled, per the consumer.Source contract: it fetches at
// most the free capacity of r.Concurrency() slots, calls r.Prepare once per
// fetched batch, runs every delivery with r.Process and
// context.WithoutCancel(ctx) on a pool of at most r.Concurrency() goroutines.
// On cancellation it stops fetching, naks what it fetched but did not start,
// waits for every Process call to return and returns nil. It returns an error when the stream or the consumer does not
// exist or disappears, when the consumer cannot be used (a push consumer, an
// ack policy other than explicit), or when the connection is closed for good.
func (s *Source) Consume(ctx context.Context, r consumer.Runner) error {
	if !s.consuming.CompareAndSwap(false, true) {
		return fmt.Errorf("dedup: nats: stream %q consumer %q: already consuming: one Source feeds one handler", s.cfg.Stream, s.cfg.Consumer)
	}
	defer s.consuming.Store(false)

	n := r.Concurrency()
	if n < 1 {
		n = 1
	}
	batch := s.cfg.Batch
	if batch == 0 || batch > n {
		batch = n
	}
	cons, err := s.bind(ctx, n)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	s.log.Info("consuming", "handler", r.Name(), "concurrency", n, "batch", batch)

	// After the last Process returned: push the acks and naks still
	// buffered in the connection out to the server, so that work done
	// before the stop is not redelivered (SPEC §8.3).
	defer s.flush()
	slots := make(chan struct{}, n) // a token per delivery being processed
	release := func(k int) {
		for range k {
			<-slots
		}
	}
	workCtx := context.WithoutCancel(ctx)
	p := newPool(workCtx, r, slots, n)
	defer p.close() // every Process returned before the flush
	// A fetched batch is claimed (Prepare: a round trip to the store) and
	// handed to the pool by a goroutine of its own, so the next fetch, a
	// round trip to the server, overlaps that claim instead of following
	// it. Batches go one at a time and in order.
	prepared := make(chan []consumer.Delivery)
	prepDone := make(chan struct{})
	go func() {
		defer close(prepDone)
		for ds := range prepared {
			r.Prepare(workCtx, ds)
			for _, d := range ds {
				p.run(d)
			}
		}
	}()
	defer func() { // runs first: every fetched batch is in the pool before it closes
		close(prepared)
		<-prepDone
	}()
	failures := 0
	lastCheck := time.Now()
	for {
		if !s.waitConnected(ctx) {
			return nil
		}
		if nc := s.js.Conn(); nc.IsClosed() {
			return fmt.Errorf("dedup: nats: stream %q consumer %q: connection closed", s.cfg.Stream, s.cfg.Consumer)
		}
		k := reserve(ctx, slots, batch, batchLinger)
		if k == 0 {
			return nil
		}
		msgs, ferr := s.fetch(cons, k)
		release(k - len(msgs))
		if ctx.Err() != nil {
			// Fetched after the stop: hand them back at once.
			s.nakAll(msgs)
			release(len(msgs))
			return nil
		}
		if ferr != nil {
			if fatal := s.classify(ctx, cons, ferr); fatal != nil {
				s.nakAll(msgs)
				release(len(msgs))
				return fatal
			}
			failures++
			lastCheck = time.Now()
			delay := consumer.Backoff(failures, 100*time.Millisecond, 5*time.Second)
			s.log.Warn("fetch failed; retrying", "handler", r.Name(), "attempt", failures, "delay", delay, "err", ferr)
			if len(msgs) == 0 {
				if !sleep(ctx, delay) {
					return nil
				}
				continue
			}
		} else {
			failures = 0
		}
		if len(msgs) == 0 {
			// An idle consumer gets no error when it is deleted on some
			// servers: look it up now and then.
			if time.Since(lastCheck) >= idleCheckEvery {
				lastCheck = time.Now()
				if fatal := s.checkGone(ctx, cons); fatal != nil {
					return fatal
				}
			}
			continue
		}
		lastCheck = time.Now()
		ds := make([]consumer.Delivery, len(msgs))
		for i, m := range msgs {
			ds[i] = s.newDelivery(m)
		}
		prepared <- ds
	}
}

// pool runs deliveries on long-lived goroutines, at most one per slot. A
// goroutine per delivery cost its start and the growth of its stack every
// time (runtime.newstack was 8 % of the worker's CPU, docs/PERFORMANCE.md);
// a pool's goroutines keep theirs. Goroutines are started when a delivery
// finds none idle, so an idle or lightly loaded Source holds few, and they
// all end when the pool is closed.
type pool struct {
	ctx   context.Context
	r     consumer.Runner
	slots chan struct{} // the Source's: a delivery holds one until Process returned
	work  chan consumer.Delivery
	size  int // at most this many goroutines
	n     int // goroutines started; only the goroutine calling run touches it
	wg    sync.WaitGroup
}

func newPool(ctx context.Context, r consumer.Runner, slots chan struct{}, size int) *pool {
	return &pool{ctx: ctx, r: r, slots: slots, work: make(chan consumer.Delivery), size: size}
}

// run hands d, which holds a slot, to an idle goroutine, or starts one. It
// never waits long: with every goroutine started and d holding a slot, at
// most size-1 deliveries are in Process, so a goroutine is idle or about to
// be (it released its slot and is going back for more work).
func (p *pool) run(d consumer.Delivery) {
	select {
	case p.work <- d:
		return
	default:
	}
	if p.n < p.size {
		p.n++
		p.wg.Go(func() { p.loop(d) })
		return
	}
	p.work <- d
}

func (p *pool) loop(d consumer.Delivery) {
	for {
		p.process(d)
		var ok bool
		if d, ok = <-p.work; !ok {
			return
		}
	}
}

func (p *pool) process(d consumer.Delivery) {
	defer func() { <-p.slots }()
	p.r.Process(p.ctx, d)
}

// close ends the goroutines once they finished their deliveries, and waits
// for them.
func (p *pool) close() {
	close(p.work)
	p.wg.Wait()
}

// batchLinger is how long a busy Source waits for more free slots before
// fetching a small batch (see reserve).
const batchLinger = 2 * time.Millisecond

// idleCheckEvery is how often an idle Source checks that its consumer still
// exists.
const idleCheckEvery = 5 * time.Second

// reserve blocks for one free slot (or ctx), then takes up to max-1 more.
// While fewer than half of max are held it lingers up to linger for slots
// still in use to come free, so that a busy handler is fed in batches of
// useful size (one fetch and one batch claim per batch) instead of one
// message per round trip. An idle pool is never made to wait: all its slots
// are free at once. It returns how many it took; 0 when ctx is done.
func reserve(ctx context.Context, slots chan struct{}, max int, linger time.Duration) int {
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	if ctx.Err() != nil {
		<-slots
		return 0
	}
	k := 1
	for k < max {
		select {
		case slots <- struct{}{}:
			k++
			continue
		default:
		}
		break
	}
	if k >= (max+1)/2 || linger <= 0 {
		return k
	}
	t := time.NewTimer(linger)
	defer t.Stop()
	for k < (max+1)/2 {
		select {
		case slots <- struct{}{}:
			k++
		case <-t.C:
			return k
		case <-ctx.Done():
			return k
		}
	}
	return k
}

// waitConnected holds the fetch loop while the connection is reconnecting:
// a pull request buffered meanwhile would be answered into an inbox nobody
// reads any more, holding its messages until AckWait. It returns false when
// ctx is done; a closed connection returns true for the caller to see.
func (s *Source) waitConnected(ctx context.Context) bool {
	nc := s.js.Conn()
	if nc.IsConnected() || nc.IsClosed() {
		return ctx.Err() == nil
	}
	s.log.Warn("NATS connection lost; waiting for the reconnect", "status", nc.Status().String())
	for attempt := 1; ; attempt++ {
		if !sleep(ctx, consumer.Backoff(attempt, 50*time.Millisecond, time.Second)) {
			return false
		}
		if nc.IsConnected() || nc.IsClosed() {
			if nc.IsConnected() {
				s.log.Info("NATS connection back; fetching again")
			}
			return true
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// fetch returns up to k messages. It first takes what is available without
// waiting; when there is nothing it waits up to FetchMaxWait for one message
// and then takes what else is available, so a batch is as large as the
// backlog allows without holding the first message back.
func (s *Source) fetch(cons jetstream.Consumer, k int) ([]jetstream.Msg, error) {
	msgs, err := collect(cons.FetchNoWait(k))
	if err != nil || len(msgs) > 0 {
		return msgs, err
	}
	msgs, err = collect(cons.Fetch(1, jetstream.FetchMaxWait(s.cfg.FetchMaxWait)))
	if err != nil || len(msgs) == 0 || k == 1 {
		return msgs, err
	}
	more, err := collect(cons.FetchNoWait(k - 1))
	return append(msgs, more...), err
}

// collect drains a fetch. The jetstream library ends every fetch by itself:
// on a full batch, on the server's "no messages" or timeout status, or one
// second after the request's expiry.
func collect(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for m := range b.Messages() {
		msgs = append(msgs, m)
	}
	return msgs, b.Error()
}

func (s *Source) flush() {
	nc := s.js.Conn()
	if !nc.IsConnected() {
		return
	}
	if err := nc.FlushTimeout(s.cfg.RequestTimeout); err != nil {
		s.log.Warn("flushing acks at stop failed; unacked messages are redelivered", "err", err)
	}
}

func (s *Source) nakAll(msgs []jetstream.Msg) {
	for _, m := range msgs {
		if err := m.Nak(); err != nil {
			s.log.Warn("nak of an unstarted message failed; it is redelivered after AckWait", "subject", m.Subject(), "err", err)
		}
	}
}

// classify decides whether a fetch error ends Consume. It returns the error
// to return, or nil to retry.
func (s *Source) classify(ctx context.Context, cons jetstream.Consumer, err error) error {
	if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) && s.js.Conn().IsClosed() {
		return fmt.Errorf("dedup: nats: stream %q consumer %q: connection closed: %w", s.cfg.Stream, s.cfg.Consumer, err)
	}
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return s.checkGone(ctx, cons)
	}
	return nil
}

// checkGone looks the consumer up and returns an error naming stream and
// consumer when it or its stream no longer exists; nil otherwise (also when
// the lookup itself fails: that is retried).
func (s *Source) checkGone(ctx context.Context, cons jetstream.Consumer) error {
	c, cancel := s.withTimeout(context.WithoutCancel(ctx))
	defer cancel()
	_, err := cons.Info(c)
	if err == nil {
		return nil
	}
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return s.goneErr(err)
	}
	if s.js.Conn().IsClosed() {
		return fmt.Errorf("dedup: nats: stream %q consumer %q: connection closed: %w", s.cfg.Stream, s.cfg.Consumer, err)
	}
	s.log.Warn("consumer lookup failed; retrying", "err", err)
	return nil
}

func (s *Source) goneErr(err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("dedup: nats: stream %q (consumer %q) does not exist: %w", s.cfg.Stream, s.cfg.Consumer, err)
	}
	return fmt.Errorf("dedup: nats: consumer %q of stream %q does not exist: %w", s.cfg.Consumer, s.cfg.Stream, err)
}

// withTimeout bounds ctx by Config.RequestTimeout when it has no deadline.
func (s *Source) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return withDefaultTimeout(ctx, s.cfg.RequestTimeout)
}
