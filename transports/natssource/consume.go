package natssource

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/bytebudget"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/gopool"
)

// consumeLoop is the state of one Consume call: the slots, the batch being
// received, the subscription and its restarts. Its run is Consume's loop;
// every field is owned by the goroutine that runs it.
type consumeLoop struct {
	s        *Source
	r        consumer.Runner
	cons     jetstream.Consumer
	n        int                // the runner's concurrency: slots
	batch    int                // the most messages a batch takes
	batching bool               // a slot is a run (ProcessBatch), not a delivery
	pullMax  int                // the subscription's PullMaxMessages (pullMax)
	buf      *bytebudget.Budget // Config.FetchBufferBytes

	// slots has a token per call being processed: a delivery, or a run when
	// the runner batches.
	slots chan struct{}
	// prepared takes a received batch to the goroutine that claims it and
	// hands it to the pool.
	prepared chan<- []consumer.Delivery
	rc       *receiver

	ds       []consumer.Delivery // received, holding slots, not yet handed to prepared
	held     bool                // a slot is taken for the next message (for the next run when batching)
	failures int                 // subscriptions that ended by themselves in a row
	restart  *time.Timer         // set while no subscription is open
	idle     bool                // no message since the last tick
	starved  int                 // idle ticks in a row that found messages the server should have sent (checkStarved)

	linger              *time.Timer
	lingering, lingered bool // a small batch waits for slots; it waited long enough
}

// startWork starts the pool that runs the calls and the goroutine that
// claims each batch before handing it to the pool, and returns the channel
// batches go to and the func that stops both once every call returned.
//
// Calls run on long-lived goroutines, one per slot at most. A call is one
// delivery (Process) or, when the runner batches, a whole prepared batch
// (ProcessBatch: JetStream keeps no order, so the fetch is one run); either
// holds one slot until it returned. A batch is claimed (Prepare: a round
// trip to the store) by a goroutine of its own, so that receiving the next
// batch overlaps that claim instead of following it. Batches go one at a
// time and in order; while the claim of one runs, the next one grows.
func (l *consumeLoop) startWork(workCtx context.Context) (chan<- []consumer.Delivery, func()) {
	l.slots = make(chan struct{}, l.n)
	r, batching, slots := l.r, l.batching, l.slots
	p := gopool.New(l.n, func(ds []consumer.Delivery) {
		defer func() { <-slots }()
		if !batching || len(ds) == 1 {
			r.Process(workCtx, ds[0])
			return
		}
		r.ProcessBatch(workCtx, ds)
	})
	prepared := make(chan []consumer.Delivery)
	prepDone := make(chan struct{})
	go func() {
		defer close(prepDone)
		for ds := range prepared {
			r.Prepare(workCtx, ds)
			if batching {
				p.Run(ds)
				continue
			}
			for i := range ds {
				p.Run(ds[i : i+1 : i+1])
			}
		}
	}()
	return prepared, func() {
		// Every prepared batch is in the pool before it closes.
		close(prepared)
		<-prepDone
		p.Close()
	}
}

// run receives messages into batches and hands them to prepared until ctx
// is cancelled or the consumer fails for good (Consume's contract).
func (l *consumeLoop) run(ctx context.Context) error {
	l.rc = newReceiver(l.s, l.cons, l.buf, l.batch, l.pullMax)
	// Without batching each message takes a slot; when the runner batches
	// a run's first message takes one and the rest of the run is covered
	// by it (takeBuffered with no slots).
	perMsg := l.slots
	if l.batching {
		perMsg = nil
	}
	if fatal := l.subscribe(); fatal != nil {
		return l.stop(fatal)
	}
	l.linger = time.NewTimer(batchLinger)
	l.linger.Stop()
	defer l.linger.Stop()
	// An idle consumer gets no error when it is deleted on some servers:
	// look it up now and then.
	tick := time.NewTicker(idleCheckEvery)
	defer tick.Stop()
	for {
		if ctx.Err() != nil { // select below picks at random among ready cases
			return l.stop(nil)
		}
		slotC, inC, sendC := l.ready()
		var restC <-chan time.Time
		if l.restart != nil {
			restC = l.restart.C
		}
		var lingerC <-chan time.Time
		if l.lingering && !l.lingered {
			lingerC = l.linger.C
		}
		select {
		case <-ctx.Done():
			return l.stop(nil)
		case slotC <- struct{}{}:
			l.held = true
		case r := <-inC:
			l.held = false
			l.idle = false
			l.starved = 0
			l.failures = 0
			if l.ds == nil {
				// Sized to what is waiting: a batch seldom grows
				// beyond it, and a quiet stream's single messages do
				// not each take a slice of Config.Batch.
				l.ds = make([]consumer.Delivery, 0, min(l.batch, len(l.rc.in)+1))
			}
			l.ds = append(l.ds, l.rc.delivery(r, l.batch-len(l.ds)))
			l.ds = l.rc.takeBuffered(l.ds, perMsg, l.batch)
		case sendC <- l.ds:
			l.ds = nil
			if l.lingering && !l.lingered {
				l.linger.Stop()
			}
			l.lingering, l.lingered = false, false
		case <-lingerC:
			l.lingered = true
		case err := <-l.rc.errs:
			if fatal := l.s.consumeError(ctx, l.cons, err); fatal != nil {
				return l.stop(fatal)
			}
		case <-l.rc.closed:
			// The subscription ended by itself: the library stops it on a
			// terminal status (the consumer was deleted, the server refused
			// the request) and when the connection closes.
			l.rc.ended()
			if fatal := l.s.subscriptionEnded(ctx, l.cons); fatal != nil {
				return l.stop(fatal)
			}
			l.retryLater("the pull subscription ended; subscribing again", nil)
		case <-restC:
			l.restart = nil
			if fatal := l.subscribe(); fatal != nil {
				return l.stop(fatal)
			}
		case <-tick.C:
			if l.idle && l.s.js.Conn().IsConnected() {
				info, fatal := l.s.lookUp(ctx, l.cons)
				if fatal != nil {
					return l.stop(fatal)
				}
				if info != nil {
					l.s.seePending(info.NumPending)
				}
				l.checkStarved(info)
			} else {
				l.starved = 0
			}
			l.idle = true
		}
	}
}

// ready returns the channels the loop waits on next: a slot to take, the
// received messages, and prepared when the batch should go now (nil
// channels for what must not happen now). It starts the linger when a
// small batch should wait.
func (l *consumeLoop) ready() (slotC chan<- struct{}, inC <-chan received, sendC chan<- []consumer.Delivery) {
	switch {
	case l.held, l.batching && len(l.ds) > 0 && len(l.ds) < l.batch:
		inC = l.rc.in
	case len(l.ds) == 0, !l.batching && len(l.ds) < l.batch:
		slotC = l.slots
	}
	if len(l.ds) == 0 {
		return slotC, inC, nil
	}
	// A busy pool is fed in batches of useful size (one batch claim each)
	// rather than a few messages per claim: while the batch is under half
	// of Config.Batch and the free slots cannot make it so (when batching:
	// the run holds the last free slot), it waits up to batchLinger for
	// slots in use to come free or, when batching, for the run to grow. A
	// quiet stream's message is never held back: its pool has its slots
	// free.
	half := (l.batch + 1) / 2
	free := l.n - len(l.slots) // slots neither in calls nor held here
	if !l.batching && len(l.ds)+free >= half || l.batching && (len(l.ds) >= half || free > 0) || l.lingered {
		sendC = l.prepared
	} else if !l.lingering {
		l.linger.Reset(batchLinger)
		l.lingering = true
	}
	return slotC, inC, sendC
}

// subscribe opens the pull subscription; a failure that may pass is
// retried after a backoff (retryLater), and a fatal one is returned.
func (l *consumeLoop) subscribe() error {
	err := l.rc.subscribe()
	if err == nil {
		return nil
	}
	if fatal := l.s.subscribeFailed(err); fatal != nil {
		return fatal
	}
	l.retryLater("subscribing failed; retrying", err)
	return nil
}

// retryLater arms the restart of the subscription after the backoff of
// the failures in a row.
func (l *consumeLoop) retryLater(msg string, err error) {
	l.failures++
	delay := dispatch.Backoff(l.failures, 100*time.Millisecond, 5*time.Second)
	if err != nil {
		l.s.log.Warn(msg, "handler", l.r.Name(), "attempt", l.failures, "delay", delay, "err", err)
	} else {
		l.s.log.Warn(msg, "handler", l.r.Name(), "attempt", l.failures, "delay", delay)
	}
	l.restart = time.NewTimer(delay)
}

// stop ends the subscription and hands back what was received and not
// started; Consume's deferred calls then wait for the pool and flush.
func (l *consumeLoop) stop(err error) error {
	if l.held {
		<-l.slots
	}
	if l.restart != nil {
		l.restart.Stop()
	}
	if l.batching && len(l.ds) > 0 {
		<-l.slots // the run's
	}
	unstarted := make([]jetstream.Msg, 0, len(l.ds))
	for _, d := range l.ds {
		if !l.batching {
			<-l.slots
		}
		unstarted = append(unstarted, d.(*delivery).msg)
	}
	l.rc.end(unstarted)
	return err
}

// starvedTicks is how many idle ticks in a row (idleCheckEvery apart) find
// the consumer with messages to deliver and nothing holding them back
// before checkStarved warns.
const starvedTicks = 2

// checkStarved warns, once per episode, when an idle subscription gets
// nothing while the consumer has messages to deliver and nothing on either
// side holds them back: a slot held for the next message (none is free
// otherwise), nobody waiting for the byte bound, the consumer neither
// paused nor at its MaxAckPending, and no priority policy that may send
// them to others. The likely cause is a message larger than
// the pull requests' byte limit (the server's max_payload lowered after it
// was stored, or the consumer's MaxRequestMaxBytes): the server then ends
// each request with 409 Message Size Exceeds MaxBytes, and jetstream asks
// again without reporting it, so nothing else tells the operator. info is
// the lookup's, nil when it failed.
func (l *consumeLoop) checkStarved(info *jetstream.ConsumerInfo) {
	_, _, waiting := l.buf.State()
	if info == nil || l.rc.cc == nil || info.NumPending == 0 || info.Paused ||
		info.Config.PriorityPolicy != jetstream.PriorityPolicyNone ||
		info.Config.MaxAckPending > 0 && info.NumAckPending >= info.Config.MaxAckPending ||
		!l.held || waiting > 0 {
		l.starved = 0
		return
	}
	l.starved++
	if l.starved != starvedTicks {
		return
	}
	l.s.log.Warn("the consumer has messages to deliver but sent none to this worker: the next one is probably larger than a pull request may take, and the server refuses such requests (409 Message Size Exceeds MaxBytes) without the client reporting it; raise the consumer's MaxRequestMaxBytes (nats consumer edit) or the server's max_payload above that message's size, or remove the message",
		"handler", l.r.Name(), "idle_for", time.Duration(starvedTicks)*idleCheckEvery, "num_pending", info.NumPending,
		"pull_max_bytes", l.rc.pullBytes, "max_payload", l.s.js.Conn().MaxPayload(), "max_request_max_bytes", info.Config.MaxRequestMaxBytes,
		"delivered_stream_seq", info.Delivered.Stream)
}
