package natssource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/bytebudget"
)

// Source consumes a JetStream durable pull consumer for one handler. It
// implements consumer.Source. One Source feeds one registered handler; a
// second concurrent Consume fails.
type Source struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger

	consuming atomic.Bool

	// buf bounds the current Consume's messages (Config.FetchBufferBytes);
	// nil between Consume calls. bufWaited is what the earlier calls'
	// bounds waited.
	bufMu     sync.Mutex
	buf       *bytebudget.Budget
	bufWaited time.Duration

	dlMu   sync.Mutex
	dlMode dlMode

	// pending is the consumer's NumPending as last seen, at pendingAt
	// (Unix nanoseconds; 0 while not known: see Pending).
	pending   atomic.Uint64
	pendingAt atomic.Int64
}

// Pending is a consumer's backlog as a Source last saw it.
type Pending struct {
	// Messages is the consumer's NumPending: the stream's messages that
	// match its filter and that it has not delivered yet, to this worker
	// or to any other bound to the same durable. Messages delivered and
	// not yet acked are not counted (at most MaxAckPending of them).
	Messages uint64
	// Seen is when it was read: from the metadata of every message the
	// Source receives, or while none arrives from the consumer's info,
	// looked up every 5 s, so a stuck or starved worker's backlog keeps
	// growing.
	Seen time.Time
}

// Pending returns the consumer's backlog as last seen; ok is false while
// Consume is not running. It may be called at any time, from any
// goroutine.
func (s *Source) Pending() (p Pending, ok bool) {
	at := s.pendingAt.Load()
	if at == 0 {
		return Pending{}, false
	}
	return Pending{Messages: s.pending.Load(), Seen: time.Unix(0, at)}, true
}

// seePending records n as the consumer's NumPending, read now.
func (s *Source) seePending(n uint64) {
	s.pending.Store(n)
	s.pendingAt.Store(time.Now().UnixNano())
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
// because its MaxAckPending follows the handler's concurrency and whether it
// batches.
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

// FetchBufferStats is a snapshot of a Source's bound on received messages
// (Config.FetchBufferBytes).
type FetchBufferStats struct {
	// Size is Config.FetchBufferBytes.
	Size int64
	// Held is what the messages received and not yet settled count; 0
	// while no Consume runs.
	Held int64
	// Waited is the time the subscription's callback has spent waiting
	// for room since New: when it grows about as fast as the wall clock,
	// the bound, not the server or the handlers, sets the pace.
	Waited time.Duration
}

// FetchBufferStats returns the state of s's bound on received messages. It
// may be called at any time, from any goroutine.
func (s *Source) FetchBufferStats() FetchBufferStats {
	s.bufMu.Lock()
	defer s.bufMu.Unlock()
	st := FetchBufferStats{Size: int64(s.cfg.FetchBufferBytes), Waited: s.bufWaited}
	if s.buf != nil {
		cur := s.buf.Stats()
		st.Held, st.Waited = cur.Held, st.Waited+cur.Waited
	}
	return st
}

// startBuffer makes the bound of a Consume call's messages and returns it.
func (s *Source) startBuffer() *bytebudget.Budget {
	b := bytebudget.New(int64(s.cfg.FetchBufferBytes))
	s.bufMu.Lock()
	s.buf = b
	s.bufMu.Unlock()
	return b
}

// endBuffer forgets the bound of a Consume call that has returned; what
// its unsettled messages held goes with it.
func (s *Source) endBuffer() {
	s.bufMu.Lock()
	s.bufWaited += s.buf.Stats().Waited
	s.buf = nil
	s.bufMu.Unlock()
}

// Reply answers m's requester (see the package-level Reply) on the Source's
// connection.
func (s *Source) Reply(ctx context.Context, m *consumer.Message, data []byte) error {
	return Reply(ctx, s.js.Conn(), m, data)
}

// Consume binds to (or creates) the durable consumer and runs its messages on
// r until ctx is cancelled, per the consumer.Source contract. It keeps one
// pull subscription open for the whole run (jetstream's Consume), which
// pulls at most Config.Batch messages (default: r.Concurrency(); see
// Config.Batch for a batching runner's) ahead and more only as they are
// taken. It holds r.Concurrency() processing slots.
//
// Without batching (r.Batching false) a slot is one delivery: whenever a
// slot is free it waits for a message, then takes every message already
// received, up to the free slots and Config.Batch (at most the
// concurrency), without waiting for more messages; the batch grows while
// the previous one is being claimed, and when the pool is so busy that
// fewer than half of Config.Batch slots are free it waits up to 2ms for
// slots to come free. Each delivery runs with r.Process.
//
// When the runner batches, a slot is one run, as the consumer.Runner
// contract has it: whenever a slot is free it waits for a message, then
// takes every message already received, up to Config.Batch (which may then
// exceed the concurrency), and the run grows while the previous one is
// being claimed; when that run holds the last free slot and is under half
// of Config.Batch it waits up to 2ms for more messages. Each run goes to
// one r.ProcessBatch call, so up to concurrency × Config.Batch messages
// are in handler calls at once (the consumer's MaxAckPending defaults to
// that, see Config.MaxAckPending).
//
// Either way it calls r.Prepare once per batch and runs the calls with
// context.WithoutCancel(ctx) on a pool of at most r.Concurrency()
// goroutines. Messages received while every slot is busy wait in the
// client's buffer, within Config.FetchBufferBytes.
//
// It notices cancellation at once: it then ends the subscription (a drain:
// the server is told to stop sending, and what it sent before that is still
// received, waiting at most Config.RequestTimeout), naks every message
// received but not started, waits for every Process call to return, flushes
// the connection and returns nil. It returns an error when the stream or the
// consumer does not exist or disappears, when the consumer cannot be used (a
// push consumer, an ack policy other than explicit), or when the connection
// is closed for good.
func (s *Source) Consume(ctx context.Context, r consumer.Runner) error {
	if !s.consuming.CompareAndSwap(false, true) {
		return fmt.Errorf("dedup: nats: stream %q consumer %q: already consuming: one Source feeds one handler", s.cfg.Stream, s.cfg.Consumer)
	}
	defer s.consuming.Store(false)

	n := max(r.Concurrency(), 1)
	batching := r.Batching()
	batch := runBatch(s.cfg.Batch, n, batching)
	ackPending := defaultAckPending(n, batch, batching)
	cons, err := s.bind(ctx, ackPending)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	s.log.Info("consuming", "handler", r.Name(), "concurrency", n, "batch", batch)
	if info := cons.CachedInfo(); info != nil {
		s.seePending(info.NumPending)
	}
	defer s.pendingAt.Store(0)

	// After the last Process returned: push the acks and naks still
	// buffered in the connection out to the server, so that work done
	// before the stop is not redelivered.
	defer s.flush()
	buf := s.startBuffer()
	defer s.endBuffer() // after every Process returned
	l := &consumeLoop{s: s, r: r, cons: cons, n: n, batch: batch, batching: batching, idle: true, buf: buf,
		pullMax: pullMax(batch, cmp.Or(s.cfg.MaxAckPending, ackPending), batching)}
	prepared, closeWork := l.startWork(context.WithoutCancel(ctx))
	defer closeWork() // every Process returned before the flush
	l.prepared = prepared
	return l.run(ctx)
}

// receiver is Consume's pull subscription: jetstream's Consume with a
// callback that only takes each message's cost from the bound (waiting for
// room there) and hands it on to in (waiting for room there too). While the
// callback waits the library counts the message as not yet delivered and
// asks the server for no more, so the client holds at most the
// subscription's PullMaxMessages, and about two pull requests' bytes
// (pullBytes), beyond what the bound and in hold.
type receiver struct {
	s         *Source
	cons      jetstream.Consumer
	buf       *bytebudget.Budget
	pullMax   int
	pullBytes int // the open subscription's (pullBytes)
	opts      []jetstream.PullConsumeOpt
	in        chan received
	errs      chan error      // from the library's error handler; full means one is waiting already
	quit      <-chan struct{} // closed at stop: the callback holds messages for end instead of waiting for room
	stopped   context.Context // quit's
	stop      context.CancelFunc

	lateMu   sync.Mutex
	late     []jetstream.Msg // received after quit, for end to nak
	lateDone bool            // end has nakked late: the callback naks at once

	cc     jetstream.ConsumeContext // nil while no subscription is open
	closed <-chan struct{}          // cc.Closed(); nil while no subscription is open

	// spare holds zero deliveries allocated together for a burst of
	// received messages, one allocation for those waiting in in rather
	// than one each. A slab stays reachable while any of its deliveries
	// is, so it is sized to what is waiting, not to Config.Batch. Only
	// Consume's loop touches it.
	spare []delivery
}

// received is a message taken from the subscription and what it holds of
// the bound.
type received struct {
	msg  jetstream.Msg
	cost int64
}

func newReceiver(s *Source, cons jetstream.Consumer, buf *bytebudget.Budget, batch, pullMax int) *receiver {
	rc := &receiver{
		s:       s,
		cons:    cons,
		buf:     buf,
		pullMax: pullMax,
		in:      make(chan received, batch),
		errs:    make(chan error, 1),
	}
	rc.stopped, rc.stop = context.WithCancel(context.Background())
	rc.quit = rc.stopped.Done()
	rc.opts = []jetstream.PullConsumeOpt{
		jetstream.PullExpiry(s.pullExpiry()),
		jetstream.ConsumeErrHandler(rc.onError),
	}
	return rc
}

// runBatch is the batch Consume takes: Config.Batch (batch) for n slots,
// and its default when it is 0. Without batching a batch is at most n
// deliveries, one a slot, and n by default. A batching runner's default run
// is n messages, and at least defaultRunBatch.
func runBatch(batch, n int, batching bool) int {
	switch {
	case batch == 0 && batching:
		return max(n, defaultRunBatch)
	case batch == 0, !batching && batch > n:
		return n
	}
	return batch
}

// defaultRunBatch is the fewest messages a batching runner's run holds by
// default, whatever the concurrency. A run costs the worker, Redis and the
// server work of its own whatever its size (a claim call, the handler's
// call, a completion call, and a pull request for every pullRuns/2 runs),
// so small runs cost more a message: the binary's forward.nats relay ran
// runs of its concurrency before, and its backlog costs the machine less a
// message with runs of 128 (docs/PERFORMANCE.md, "Relay throughput"). 128
// is also the most completions the engine stores in one call.
const defaultRunBatch = 128

// pullRuns is how many runs a batching runner's subscription asks for
// ahead. The library asks again whenever half of what it asked for came,
// and every pull request costs the server (and the client) work of its
// own beyond the messages it brings: asking for one run costs a request
// per half run, asking for pullRuns runs a request per pullRuns/2 runs.
// The messages asked for ahead wait in the client, inside the consumer's
// MaxAckPending and AckWait like the messages of the run being claimed.
const pullRuns = 8

// pullMax is the subscription's PullMaxMessages: batch; for a batching
// runner pullRuns runs, within the consumer's MaxAckPending ackPending (the
// server delivers no more than that unacknowledged) and never under batch.
func pullMax(batch, ackPending int, batching bool) int {
	if !batching {
		return batch
	}
	return max(batch, min(batch*pullRuns, ackPending))
}

// pullExpiry is how long one pull request waits on the server: FetchMaxWait,
// at least the library's minimum of a second. The server heartbeats a
// waiting request every half of it.
func (s *Source) pullExpiry() time.Duration {
	return max(s.cfg.FetchMaxWait, time.Second)
}

func (rc *receiver) subscribe() error {
	rc.pullBytes = rc.s.pullBytes(rc.cons)
	opts := append(rc.opts[:len(rc.opts):len(rc.opts)],
		jetstream.PullMaxMessagesWithBytesLimit(rc.pullMax, rc.pullBytes))
	cc, err := rc.cons.Consume(rc.handle, opts...)
	if err != nil {
		return err
	}
	rc.cc, rc.closed = cc, cc.Closed()
	return nil
}

// handle is the subscription's callback. It runs on the subscription's own
// goroutine, one message at a time.
func (rc *receiver) handle(m jetstream.Msg) {
	cost := rc.buf.Capped(messageCost(m))
	if rc.buf.Acquire(rc.stopped, cost) != nil {
		rc.lateMsg(m)
		return
	}
	rc.send(received{m, cost})
}

// send hands r to Consume's loop, or to end once quit is closed. When both
// are ready select may still choose in, after end took what was there, so
// a send after quit checks whether end is done and, if it is, naks what in
// holds: nothing else receives from in any more.
func (rc *receiver) send(r received) {
	select {
	case rc.in <- r:
		select {
		case <-rc.quit:
			rc.lateMu.Lock()
			if rc.lateDone {
				rc.s.nakAll(rc.drainIn(nil)...)
			}
			rc.lateMu.Unlock()
		default:
		}
	case <-rc.quit:
		// What it holds goes with the bound at Consume's end.
		rc.lateMsg(r.msg)
	}
}

// lateMsg keeps m, received after quit, for end to nak, or naks it at once
// when end is done.
func (rc *receiver) lateMsg(m jetstream.Msg) {
	rc.lateMu.Lock()
	if !rc.lateDone {
		rc.late = append(rc.late, m)
		rc.lateMu.Unlock()
		return
	}
	rc.lateMu.Unlock()
	rc.s.nakAll(m)
}

// drainIn appends to msgs the messages waiting in in, without waiting.
func (rc *receiver) drainIn(msgs []jetstream.Msg) []jetstream.Msg {
	for {
		select {
		case r := <-rc.in:
			msgs = append(msgs, r.msg)
		default:
			return msgs
		}
	}
}

func (rc *receiver) onError(_ jetstream.ConsumeContext, err error) {
	select {
	case rc.errs <- err:
	default: // Consume has one to look at already
	}
}

// ended forgets a subscription that ended by itself.
func (rc *receiver) ended() {
	rc.cc, rc.closed = nil, nil
}

// takeBuffered appends to ds the messages already received, each with a
// free slot of slots (none when slots is nil: a run's one slot covers
// them), until ds holds max or either runs out. It never waits.
func (rc *receiver) takeBuffered(ds []consumer.Delivery, slots chan struct{}, max int) []consumer.Delivery {
	for len(ds) < max {
		if slots != nil {
			select {
			case slots <- struct{}{}:
			default:
				return ds
			}
		}
		select {
		case r := <-rc.in:
			ds = append(ds, rc.delivery(r, max-len(ds)))
		default:
			if slots != nil {
				<-slots
			}
			return ds
		}
	}
	return ds
}

// delivery returns r's delivery, taken from spare; room is how many more
// messages the batch being built can take, r included, which bounds a new
// slab along with the messages waiting in in. The delivery gives r's cost
// back to the bound when it is settled. A slab stays reachable while any of
// its deliveries is, so a settled message's memory can outlast its cost by
// as long as the other messages of its burst are in calls.
func (rc *receiver) delivery(r received, room int) *delivery {
	if len(rc.spare) == 0 {
		rc.spare = make([]delivery, max(1, min(len(rc.in)+1, room)))
	}
	d := &rc.spare[0]
	rc.spare = rc.spare[1:]
	rc.s.initDelivery(d, r.msg)
	d.buf = rc.buf
	d.cost.Store(r.cost)
	return d
}

// defaultAckPending is the consumer's MaxAckPending when
// Config.MaxAckPending is 0: the concurrency, which is how many messages
// are in calls at once without batching; when the
// runner batches, concurrency × batch, the most there can be in calls,
// capped at maxDefaultAckPending (and never under the concurrency).
func defaultAckPending(concurrency, batch int, batching bool) int {
	if !batching {
		return concurrency
	}
	return max(concurrency, min(concurrency*batch, maxDefaultAckPending))
}

// maxDefaultAckPending caps the default MaxAckPending of a batching
// runner: 64 runs of 64 messages. The window bounds how many messages one
// worker has unacknowledged, so a larger one is asked for explicitly
// (Config.MaxAckPending).
const maxDefaultAckPending = 4096

// end drains the subscription and naks unstarted with every message
// received meanwhile or still waiting in in. The library unsubscribes and
// flushes, so the server sends nothing more and what it sent before is
// received. The naks wait for the drain and then for dropPulls: a nak sent
// while the server still holds this subscription's pull request can be
// lost to it (see dropPulls). end waits at most RequestTimeout for the
// drain (the connection may be down); a message still on its way after
// that is nakked when it comes.
func (rc *receiver) end(unstarted []jetstream.Msg) {
	rc.stop()
	if rc.cc != nil {
		rc.cc.Drain()
		t := time.NewTimer(rc.s.cfg.RequestTimeout)
		defer t.Stop()
	wait:
		for {
			select {
			case r := <-rc.in:
				unstarted = append(unstarted, r.msg)
			case <-rc.closed:
				break wait
			case <-t.C:
				rc.s.log.Warn("the pull subscription did not drain in time; messages still on their way are nakked if they arrive, else redelivered after AckWait", "timeout", rc.s.cfg.RequestTimeout)
				break wait
			}
		}
		rc.ended()
	}
	unstarted = rc.drainIn(unstarted)
	rc.s.dropPulls(rc.cons)
	// A callback still running (the drain timed out) may have sent to in
	// since; from lateDone on it naks such messages itself (see send).
	rc.lateMu.Lock()
	unstarted = append(rc.drainIn(unstarted), rc.late...)
	rc.late, rc.lateDone = nil, true
	rc.lateMu.Unlock()
	rc.s.nakAll(unstarted...)
}

// dropPulls makes the server forget the pull requests of a subscription
// that has ended, before its messages are nakked. A nakked message goes to
// the consumer's redelivery queue, and a server before 2.10.16 takes it
// off that queue for the first pull request waiting even when nobody
// listens to that request any more; it then delivers it to no one, and the
// message comes back only after AckWait (fixed by nats-server commit
// 8272e74, "Fixed delivery counts on failed deliveries"; Debian 12 ships
// 2.9.10). Such a request waits until it expires or the server next checks
// interest, and a consumer info request is such a check. Newer servers put
// the message back on the queue; for them the request costs one round trip
// at stop.
func (s *Source) dropPulls(cons jetstream.Consumer) {
	if !s.js.Conn().IsConnected() {
		return
	}
	ctx, cancel := s.withTimeout(context.Background())
	defer cancel()
	if _, err := cons.Info(ctx); err != nil {
		s.log.Debug("consumer info before the naks at stop failed", "err", err)
	}
}

// consumeError decides whether an error the subscription reported ends
// Consume. It returns the error to return, or nil to go on; the library
// itself pulls again after a missed heartbeat or a reconnect.
func (s *Source) consumeError(ctx context.Context, cons jetstream.Consumer, err error) error {
	nc := s.js.Conn()
	if errors.Is(err, nats.ErrConnectionClosed) || nc.IsClosed() {
		return s.closedErr(err)
	}
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrNoHeartbeat) && nc.IsConnected() {
		s.log.Debug("pull subscription error; checking the consumer", "err", err)
		return s.checkGone(ctx, cons)
	}
	s.log.Debug("pull subscription error", "err", err)
	return nil
}

// subscriptionEnded returns the error that ended the subscription when it
// cannot be opened again.
func (s *Source) subscriptionEnded(ctx context.Context, cons jetstream.Consumer) error {
	if s.js.Conn().IsClosed() {
		return s.closedErr(nats.ErrConnectionClosed)
	}
	return s.checkGone(ctx, cons)
}

func (s *Source) subscribeFailed(err error) error {
	if errors.Is(err, nats.ErrConnectionClosed) || s.js.Conn().IsClosed() {
		return s.closedErr(err)
	}
	return nil
}

func (s *Source) closedErr(err error) error {
	return fmt.Errorf("dedup: nats: stream %q consumer %q: connection closed: %w", s.cfg.Stream, s.cfg.Consumer, err)
}

// batchLinger is how long a small batch waits for slots in use to come free
// while the pool is busy (see Consume).
const batchLinger = 2 * time.Millisecond

// idleCheckEvery is how often an idle Source checks that its consumer still
// exists.
const idleCheckEvery = 5 * time.Second

func (s *Source) flush() {
	nc := s.js.Conn()
	if !nc.IsConnected() {
		return
	}
	if err := nc.FlushTimeout(s.cfg.RequestTimeout); err != nil {
		s.log.Warn("flushing acks at stop failed; unacked messages are redelivered", "err", err)
	}
}

// nakAll hands back messages received and not started, for prompt
// redelivery. Failures are logged once per call.
func (s *Source) nakAll(msgs ...jetstream.Msg) {
	failed := 0
	var last error
	for _, m := range msgs {
		if err := m.Nak(); err != nil {
			failed++
			last = err
		}
	}
	if failed > 0 {
		s.log.Warn("nak of unstarted messages failed; they are redelivered after AckWait", "messages", failed, "err", last)
	}
}

// checkGone looks the consumer up and returns an error naming stream and
// consumer when it or its stream no longer exists; nil otherwise (also when
// the lookup itself fails: that is retried).
func (s *Source) checkGone(ctx context.Context, cons jetstream.Consumer) error {
	_, err := s.lookUp(ctx, cons)
	return err
}

// lookUp is checkGone that also returns the consumer's info, nil when the
// lookup failed.
func (s *Source) lookUp(ctx context.Context, cons jetstream.Consumer) (*jetstream.ConsumerInfo, error) {
	c, cancel := s.withTimeout(ctx)
	defer cancel()
	info, err := cons.Info(c)
	if err == nil {
		return info, nil
	}
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, s.goneErr(err)
	}
	if s.js.Conn().IsClosed() {
		return nil, s.closedErr(err)
	}
	if ctx.Err() == nil {
		s.log.Warn("consumer lookup failed; retrying", "err", err)
	}
	return nil, nil
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
