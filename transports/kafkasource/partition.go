package kafkasource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/sleep"
)

// partition is one assigned partition in one generation. Three kinds of
// goroutine work on it, all owned by it and waited for by wait:
//
//   - the fetcher reads batches from the partition leader, one fetch
//     ahead of the dispatcher (see more);
//   - the dispatcher hands each batch to Runner.Prepare, records its offsets
//     as unfinished and queues the deliveries on lanes;
//   - a lane runs its queue in order, retrying in place. Partition
//     ordering has one lane; key ordering one per key. When the runner
//     batches (Runner.Batching: a batch handler), a lane takes its whole
//     queued run, up to BatchSize, in one Runner.ProcessBatch call; a
//     nakked delivery of the run is then retried, in order and after its
//     delay, before the lane takes its next run. Otherwise it runs one
//     delivery at a time.
type partition struct {
	g    *generation
	id   int
	log  *slog.Logger
	from int64 // the assignment's offset: absolute, or FirstOffset/LastOffset

	stopOnce  sync.Once
	stopCh    chan struct{} // closed by stop: no new deliveries start
	stopCause error

	fetchCtx    context.Context // cancelled by stop
	cancelFetch context.CancelFunc

	workCtx    context.Context // passed to Process; cancelled on revoke timeout
	cancelWork context.CancelCauseFunc

	batches chan fetched
	space   chan struct{} // signalled when offsets finish
	// more holds the fetcher's permission to fetch again after it handed
	// the dispatcher messages: the dispatcher grants it once the rest of
	// its fetch fits in MaxUnfinished, so a partition holds one decoded
	// fetch ahead of what it runs, not a queue of them.
	more     chan struct{}
	mayFetch bool // the fetcher holds the permission; only the fetcher uses it
	// lastFetched is how many messages the last fetch returned; only the
	// fetcher uses it.
	lastFetched int
	// estimate is the cost of the partition's last fetch, 0 before its
	// first (fetchBudgeted); only the fetcher uses it.
	estimate int64

	loops sync.WaitGroup // fetcher and dispatcher
	lanes sync.WaitGroup // lane goroutines; Add only by the dispatcher

	mu         sync.Mutex
	track      tracker
	lanesByID  map[string]*lane
	lastCommit int64
	// held is what the partition holds of the source's budget: acquired
	// for its fetches, released as their messages are acked, and in full
	// by wait once nothing of the partition runs (released).
	held     int64
	released bool
	// end is the partition's end as a fetch or a listing last reported
	// it (the high watermark; under read_committed the last stable
	// offset), -1 before the first; endAt is when (Source.Lag).
	end   int64
	endAt time.Time
}

// fetched is what the fetcher hands the dispatcher: messages in offset order
// and the offset it will read next.
type fetched struct {
	msgs blocks
	next int64
}

type lane struct {
	key   string
	queue []*delivery
	// more has a token when deliveries were queued while the lane's
	// goroutine ran (nil for a lane nothing is queued to later): a lane
	// waiting for its last call to store its results starts them at once.
	more chan struct{}
}

func newPartition(g *generation, id int, start int64) *partition {
	p := &partition{
		g:          g,
		id:         id,
		log:        g.m.s.log.With("partition", id),
		from:       start,
		stopCh:     make(chan struct{}),
		batches:    make(chan fetched),
		space:      make(chan struct{}, 1),
		mayFetch:   true,
		more:       make(chan struct{}, 1),
		lanesByID:  make(map[string]*lane),
		lastCommit: -1,
		end:        -1,
	}
	if start >= 0 {
		p.lastCommit = start
		p.track.next = start
	} else {
		p.track.next = -1
	}
	p.fetchCtx, p.cancelFetch = context.WithCancel(g.m.base)
	p.workCtx, p.cancelWork = context.WithCancelCause(g.m.base)
	return p
}

// start launches the fetcher and the dispatcher.
func (p *partition) start() {
	p.loops.Go(p.fetch)
	p.loops.Go(p.dispatch)
}

// stop stops fetching and starting deliveries; in-flight ones go on.
func (p *partition) stop(cause error) {
	p.stopOnce.Do(func() {
		p.stopCause = cause
		close(p.stopCh)
		p.cancelFetch()
	})
}

// wait returns when every goroutine of the partition has returned. Call it
// after stop.
func (p *partition) wait() {
	p.loops.Wait()
	p.lanes.Wait()
	// What was fetched and never acked (not dispatched, abandoned, or in
	// a fetch the dispatcher did not take) is no longer referenced.
	p.mu.Lock()
	p.g.m.s.budget.Release(p.held)
	p.held, p.released = 0, true
	p.mu.Unlock()
}

func (p *partition) stopped() bool {
	select {
	case <-p.stopCh:
		return true
	default:
		return false
	}
}

// toCommit returns the watermark when it moved since the last commit.
func (p *partition) toCommit() (int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.track.watermark()
	if w < 0 || w == p.lastCommit {
		return 0, false
	}
	return w, true
}

func (p *partition) committed(w int64) {
	p.mu.Lock()
	p.lastCommit = w
	p.mu.Unlock()
}

// seeEnd records end as the partition's end, read now.
func (p *partition) seeEnd(end int64) {
	p.mu.Lock()
	p.end, p.endAt = end, time.Now()
	p.mu.Unlock()
}

// lag is the partition's PartitionLag; ok is false until both its position
// and its end are known.
func (p *partition) lag() (l PartitionLag, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.track.watermark()
	if w < 0 || p.end < 0 {
		return PartitionLag{}, false
	}
	return PartitionLag{Partition: p.id, Offset: w, End: p.end, Lag: max(p.end-w, 0), Seen: p.endAt}, true
}

// finish marks offset as done; the watermark may move past it. cost, what
// the message's fetch acquired for it, goes back to the source's budget.
func (p *partition) finish(offset, cost int64) {
	p.mu.Lock()
	p.track.finish(offset)
	p.unhold(cost)
	p.mu.Unlock()
	select {
	case p.space <- struct{}{}:
	default:
	}
}

// hold records n more bytes held of the source's budget.
func (p *partition) hold(n int64) {
	p.mu.Lock()
	if p.released {
		// wait released everything already; nothing is held for this.
		p.g.m.s.budget.Release(n)
	} else {
		p.held += n
	}
	p.mu.Unlock()
}

// unhold gives n bytes of what the partition holds back to the source's
// budget; p.mu is held.
func (p *partition) unhold(n int64) {
	n = min(n, p.held)
	p.held -= n
	p.g.m.s.budget.Release(n)
}

// ---- fetcher ----

func (p *partition) fetch() {
	s := p.g.m.s
	ctx := p.fetchCtx
	offset := p.from
	unknown := 0
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !sleep.For(ctx, backoff(attempt)) {
			return
		}
		tr := s.transport()
		conn, pos, err := p.connect(ctx, tr, offset)
		// tr served only the connection's position; fetches go in the
		// rounds to the leader the connection found (rounds.go).
		tr.CloseIdleConnections()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if isFatal(err) {
				p.fail(err)
				return
			}
			if errors.Is(err, kafka.UnknownTopicOrPartition) {
				if unknown++; unknown >= 10 {
					p.fail(err)
					return
				}
			}
			p.log.Warn("connecting to the partition leader failed; retrying", "attempt", attempt+1, "err", err)
			continue
		}
		unknown = 0
		leader := conn.Broker().ID
		conn.Close()
		if pos != offset {
			offset = pos
			if !p.send(fetched{next: pos}) {
				return
			}
		}
		before := offset
		lr := p.g.rounds.join(leader)
		offset, err = p.readLoop(ctx, lr, offset)
		p.g.rounds.leave(lr, p.id)
		if ctx.Err() != nil {
			return
		}
		if isFatal(err) {
			p.fail(err)
			return
		}
		if offset > before {
			// The connection made progress: reconnect without growing the
			// backoff. A connection that keeps failing at once backs off.
			attempt = 0
		}
		p.log.Debug("fetch connection ended; reconnecting", "offset", offset, "err", err)
	}
}

// fail ends Consume with err, naming the partition.
func (p *partition) fail(err error) {
	p.g.fail(fmt.Errorf("dedup: kafka: topic %q partition %d: %w", p.g.m.s.cfg.Topic, p.id, err))
}

// connect dials the partition leader and positions at offset, resolving
// FirstOffset/LastOffset and offsets that fell out of retention. Under
// read_committed LastOffset is the last stable offset, asked through tr:
// the end of the partition would pass the records of an open transaction,
// which then would never be read.
func (p *partition) connect(ctx context.Context, tr *kafka.Transport, offset int64) (*kafka.Conn, int64, error) {
	s := p.g.m.s
	var err error
	for _, b := range s.cfg.Brokers {
		var conn *kafka.Conn
		dctx, cancel := context.WithTimeout(ctx, s.cfg.NetworkTimeout)
		conn, err = s.dialer.DialLeader(dctx, "tcp", b, s.cfg.Topic, p.id)
		cancel()
		if err != nil {
			continue
		}
		_ = conn.SetDeadline(time.Now().Add(s.cfg.NetworkTimeout))
		first, last, oerr := conn.ReadOffsets()
		if oerr == nil && offset == kafka.LastOffset && s.cfg.Isolation == IsolationReadCommitted {
			last, oerr = p.lastStable(ctx, tr)
		}
		if oerr != nil {
			conn.Close()
			return nil, 0, oerr
		}
		switch {
		case offset == kafka.FirstOffset:
			offset = first
		case offset == kafka.LastOffset:
			offset = last
		case offset < first:
			p.log.Warn("committed offset is before the first retained offset: messages were deleted unprocessed", "offset", offset, "first", first)
			offset = first
		case offset > last:
			p.log.Warn("committed offset is past the end of the partition; starting at the end", "offset", offset, "last", last)
			offset = last
		}
		if _, serr := conn.Seek(offset, kafka.SeekAbsolute|kafka.SeekDontCheck); serr != nil {
			conn.Close()
			return nil, 0, serr
		}
		_ = conn.SetDeadline(time.Time{})
		return conn, offset, nil
	}
	return nil, 0, err
}

// readLoop fetches batches in leader's rounds until a fetch fails, after
// which the fetcher finds the partition's leader again, or ctx ends. It
// returns the offset to resume from.
func (p *partition) readLoop(ctx context.Context, leader *leaderRounds, offset int64) (int64, error) {
	for {
		if ctx.Err() != nil {
			return offset, ctx.Err()
		}
		if !p.mayFetch {
			select {
			case <-p.more:
				p.mayFetch = true
			case <-ctx.Done():
				return offset, ctx.Err()
			}
		}
		msgs, next, err := p.fetchBudgeted(ctx, leader, offset)
		if errors.Is(err, errBudgetWait) {
			return offset, ctx.Err()
		}
		if n := msgs.len(); n > 0 || next > offset {
			if !p.send(fetched{msgs: msgs, next: next}) {
				return next, ctx.Err()
			}
			offset = next
			if n > 0 {
				p.mayFetch = false
			}
		}
		switch {
		case err == nil, errors.Is(err, kafka.RequestTimedOut):
			continue
		case errors.Is(err, kafka.OffsetOutOfRange):
			// Reconnecting re-resolves the position against the retained range.
			return offset, err
		default:
			return offset, err
		}
	}
}

// errBudgetWait is fetchBudgeted's error when ctx ended while it waited for
// the source's budget: nothing was fetched.
var errBudgetWait = errors.New("dedup: kafka: stopped while waiting for the fetch budget")

// fetchBudgeted is fetchOnce within the source's budget: it acquires the
// fetch's expected cost first, and after the fetch holds exactly what the
// returned messages cost. A partition whose fetches' size is not known yet
// (its first fetch) fetches only while no other such fetch runs: a
// backlog's start decodes one unknown batch at a time, and each later one
// acquires against what the earlier ones turned out to hold.
func (p *partition) fetchBudgeted(ctx context.Context, leader *leaderRounds, offset int64) (blocks, int64, error) {
	s := p.g.m.s
	b := s.budget
	wait := s.cfg.MaxWait
	if p.estimate == 0 {
		select {
		case s.probe <- struct{}{}:
			defer func() { <-s.probe }()
		case <-ctx.Done():
			return nil, offset, errBudgetWait
		}
		// The broker answers at once: a partition with nothing to read
		// does not keep the others' first fetches waiting for MaxWait.
		wait = 0
	}
	want := b.Capped(max(p.estimate, int64(s.cfg.FetchMaxBytes)))
	if err := b.Acquire(ctx, want); err != nil {
		return nil, offset, errBudgetWait
	}
	p.hold(want)
	// fetchOnce is bounded by MaxWait + NetworkTimeout and returns at
	// once when ctx ends.
	msgs, next, err := p.fetchOnce(ctx, leader, offset, wait)
	var cost int64
	for _, b := range msgs {
		for i := range b {
			cost += messageCost(&b[i])
		}
	}
	switch {
	case cost > want:
		b.Take(cost - want)
		p.hold(cost - want)
	case cost < want:
		p.mu.Lock()
		p.unhold(want - cost)
		p.mu.Unlock()
	}
	if err == nil || len(msgs) > 0 {
		// The next fetch is expected to be like this one; an empty one
		// (the partition's end) still counts FetchMaxBytes above.
		p.estimate = max(cost, 1)
	}
	return msgs, next, err
}

// send hands f to the dispatcher; false when stopping.
func (p *partition) send(f fetched) bool {
	select {
	case p.batches <- f:
		return true
	case <-p.stopCh:
		return false
	}
}

func backoff(attempt int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < attempt && d < 5*time.Second; i++ {
		d *= 2
	}
	return min(d, 5*time.Second)
}

// ---- dispatcher ----

func (p *partition) dispatch() {
	s := p.g.m.s
	limit := s.cfg.BatchSize
	// The fetcher may fetch again once this many messages of its last
	// fetch are left to dispatch: about one window of unfinished messages
	// runs while it fetches.
	ahead := max(p.g.m.unfinished, limit)
	for {
		var f fetched
		select {
		case <-p.stopCh:
			return
		case f = <-p.batches:
		}
		if p.stopped() {
			return
		}
		left := f.msgs.len()
		asked := left == 0 // the fetcher needs no permission after no messages
		for bi, chunk := range f.msgs {
			// A block holds at most limit messages (filter.block, from the
			// same BatchSize): it is one chunk. From here on its
			// deliveries alone keep it: one whose chunk is done is not
			// kept while the rest of a large fetch is dispatched.
			f.msgs[bi] = nil
			if !asked && left <= ahead {
				p.fetchMore()
				asked = true
			}
			left -= len(chunk)
			if !p.waitSpace(p.g.m.unfinished) {
				return
			}
			ds := newDeliveries(p, chunk)
			batch := make([]consumer.Delivery, len(chunk))
			p.mu.Lock()
			for i := range chunk {
				batch[i] = ds[i]
				p.track.add(chunk[i].Offset)
			}
			p.mu.Unlock()
			p.g.m.r.Prepare(p.workCtx, batch)
			p.enqueue(ds)
		}
		if !asked {
			p.fetchMore()
		}
		p.mu.Lock()
		p.track.advance(f.next)
		p.mu.Unlock()
	}
}

// fetchMore lets the fetcher fetch again.
func (p *partition) fetchMore() {
	select {
	case p.more <- struct{}{}:
	default:
	}
}

// waitSpace blocks while limit or more offsets are unfinished (counted from
// the oldest unfinished one): the partition never runs, and claims, far ahead
// of its oldest unfinished message.
func (p *partition) waitSpace(limit int) bool {
	for {
		p.mu.Lock()
		n := p.track.pending()
		p.mu.Unlock()
		if n < limit {
			return true
		}
		select {
		case <-p.space:
		case <-p.stopCh:
			return false
		}
	}
}

func (p *partition) enqueue(ds []*delivery) {
	keyed := p.g.m.s.cfg.Ordering == OrderingKey
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range ds {
		key := ""
		if keyed {
			if len(d.msg.Key) == 0 {
				// No key, no order to keep: a lane of its own.
				p.lanes.Go(func() { p.runLane(&lane{queue: []*delivery{d}}, false) })
				continue
			}
			key = string(d.msg.Key)
		}
		if l, ok := p.lanesByID[key]; ok {
			l.queue = append(l.queue, d)
			select {
			case l.more <- struct{}{}:
			default:
			}
			continue
		}
		l := &lane{key: key, queue: []*delivery{d}, more: make(chan struct{}, 1)}
		p.lanesByID[key] = l
		p.lanes.Go(func() { p.runLane(l, true) })
	}
}

// ---- lanes ----

// runLane runs l's queue in order until it is empty. It takes the queue in
// runs, each in one ProcessBatch call: of up to BatchSize when the runner
// batches, else of one delivery. A run's storing of its results overlaps
// the next run: once a call reports that its handlers are done
// (consumer.RunHandledNotifier), the lane starts its next run, at once or
// as soon as deliveries are queued to it, then waits for the first call to
// return and retries that call's nakked deliveries before it starts a
// third. A failed handler holds back the rest of the order as
// before, since a call whose handler failed reports nothing before it
// returns.
func (p *partition) runLane(l *lane, registered bool) {
	limit := 1
	if p.g.m.r.Batching() {
		limit = p.g.m.s.cfg.BatchSize
	}
	// prev is a call whose handlers are done and which has not returned.
	var prev *procCall
	for {
		p.mu.Lock()
		if len(l.queue) == 0 {
			if prev != nil {
				p.mu.Unlock()
				// Deliveries queued while prev stores its results start
				// then, not once it returned.
				if prev.returnedOr(l.more) {
					p.retryRun(prev.run)
					prev = nil
				}
				continue
			}
			if registered {
				delete(p.lanesByID, l.key)
			}
			p.mu.Unlock()
			return
		}
		n := min(len(l.queue), limit)
		run := make([]*delivery, n)
		copy(run, l.queue[:n])
		clear(l.queue[:n])
		l.queue = l.queue[n:]
		p.mu.Unlock()
		prev = p.deliverRun(run, prev)
	}
}

// deliverRun runs run in one ProcessBatch call and returns once its
// handlers are done, having finished prev, the lane's previous call, on the
// way (see finishRun). It returns the call while it still stores its
// results, or nil once the run is finished.
func (p *partition) deliverRun(run []*delivery, prev *procCall) *procCall {
	if !p.acquire() {
		p.abandonAll(run)
		if prev != nil {
			p.finishRun(prev)
		}
		return nil
	}
	c := p.g.m.procs.startBatch(p.workCtx, run)
	returned := c.handledOrReturned()
	if prev != nil {
		p.finishRun(prev)
	}
	if !returned {
		return c
	}
	p.retryRun(c.run)
	return nil
}

// finishRun waits for a call whose handlers were done to return, then
// retries its nakked deliveries in place.
func (p *partition) finishRun(c *procCall) {
	c.wait()
	p.retryRun(c.run)
}

// retryRun retries the nakked deliveries of a returned run in place, in
// order, each until it is acked. It returns with the run's offsets finished,
// or some unfinished when the partition stops.
func (p *partition) retryRun(run []*delivery) {
	for _, d := range run {
		st, delay := d.outcome()
		if st == settledAck {
			continue
		}
		next, ok := p.again(d, st, delay)
		if !ok {
			return
		}
		p.deliver(next)
	}
}

// acquire takes one of the member's concurrency slots, waiting while none is
// free; it returns false, holding none, once the partition stops.
func (p *partition) acquire() bool {
	if p.stopped() {
		return false
	}
	select {
	case p.g.m.sem <- struct{}{}:
		return true
	case <-p.stopCh:
		return false
	}
}

func (p *partition) abandonAll(run []*delivery) {
	for _, d := range run {
		p.abandon(d)
	}
}

// deliver runs d to settlement, retrying in place while it is nakked. It
// returns with d's offset finished, or unfinished when the partition stops.
func (p *partition) deliver(d *delivery) {
	m := p.g.m
	for {
		if !p.acquire() {
			p.abandon(d)
			return
		}
		m.procs.process(p.workCtx, d)
		st, delay := d.outcome()
		if st == settledAck {
			return
		}
		var ok bool
		if d, ok = p.again(d, st, delay); !ok {
			return
		}
	}
}

// again waits out the delay of a processed delivery that was not acked and
// returns its next attempt, or false when the partition stops (its offset
// stays unfinished and uncommitted).
func (p *partition) again(d *delivery, st settlement, delay time.Duration) (*delivery, bool) {
	if st != settledNak {
		if p.workCtx.Err() != nil {
			return nil, false
		}
		delay = time.Second
		p.log.Error("processor returned without settling the delivery; retrying", "offset", d.msg.Origin.Offset, "delay", delay)
	}
	if p.stopped() || p.workCtx.Err() != nil {
		return nil, false
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-p.stopCh:
			t.Stop()
			return nil, false
		}
	}
	return d.retry(), true
}

// abandon hands a delivery that will not run to Process with a cancelled
// context (the contract of consumer.Processor.Prepare: a prepared delivery is
// always processed once), so the processor releases what it prepared. Its
// offset stays unfinished.
func (p *partition) abandon(d *delivery) {
	ctx, cancel := context.WithCancelCause(p.workCtx)
	cancel(p.stopCause)
	p.g.m.r.Process(ctx, d)
}

// ---- offset tracking ----

// tracker finds the lowest unfinished offset of a partition. Offsets are
// added in increasing order (with gaps: compaction, transaction markers) and
// finished in any order.
type tracker struct {
	offs []int64 // unfinished or finished-but-behind-an-unfinished, ascending
	done []bool
	head int
	next int64 // the offset after the last one dispatched; -1 until known
}

func (t *tracker) add(off int64) {
	t.offs = append(t.offs, off)
	t.done = append(t.done, false)
	if off+1 > t.next {
		t.next = off + 1
	}
}

func (t *tracker) advance(next int64) {
	if next > t.next {
		t.next = next
	}
}

func (t *tracker) finish(off int64) {
	live := t.offs[t.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i] >= off })
	if i == len(live) || live[i] != off {
		return
	}
	t.done[t.head+i] = true
	for t.head < len(t.offs) && t.done[t.head] {
		t.head++
	}
	if t.head == len(t.offs) {
		t.offs, t.done, t.head = t.offs[:0], t.done[:0], 0
	} else if t.head > 1024 && t.head*2 > len(t.offs) {
		n := copy(t.offs, t.offs[t.head:])
		copy(t.done, t.done[t.head:])
		t.offs, t.done, t.head = t.offs[:n], t.done[:n], 0
	}
}

// pending counts offsets from the lowest unfinished one on.
func (t *tracker) pending() int { return len(t.offs) - t.head }

// watermark is the offset to commit: the lowest unfinished offset, or the
// next offset to read when everything dispatched has finished.
func (t *tracker) watermark() int64 {
	if t.head < len(t.offs) {
		return t.offs[t.head]
	}
	return t.next
}
