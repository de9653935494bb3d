package kafkasource

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
)

// roundWait is the longest a shared fetch waits on the broker while a
// partition of its leader is not in it: that partition, once it asks,
// waits for the fetch in flight to return before it goes in the next. The
// same partitions asking again after a fetch that found nothing for any of
// them double it, up to roundWaitMax: a partition that stays away for
// long (its handler is slow, its lane full) then costs the broker ten
// empty fetches a second rather than a hundred, and waits at most that
// long once it asks.
const (
	roundWait    = 10 * time.Millisecond
	roundWaitMax = 100 * time.Millisecond
)

// rounds shares Fetch requests among a generation's partitions: each broker
// that leads some of them has one request in flight at a time, and the
// partitions that ask to fetch while it is in flight go together in the
// next (a round). A partition's fetcher still decides when and from where
// it fetches, within its budget (fetchBudgeted); a round only carries its
// ask to the broker and its part of the answer back, which the fetcher
// decodes itself (fetchOnce).
//
// One request for the partitions of a broker, as the Java consumer and
// franz-go fetch, rather than one a partition: at a steady rate, where a
// fetch returns one or two messages, each response and each of its
// goroutines' wake-ups costs the process about as much as the messages in
// it, and eight partitions' fetches in flight left the source behind the
// topic on a busy machine (docs/PERFORMANCE.md, "Latency at 2 000 msgs/s").
//
// A round waits on the broker up to the longest of its asks' waits (the
// shortest of them: a partition's first fetch asks for none), and no
// longer than roundWait (growing to roundWaitMax) while a partition of its
// leader is not in it, so that a partition back from waiting for room does
// not wait a long poll of the others out. After a round, the partitions it
// answered with no records, which ask again at once, go together in the
// next: partitions at their end keep long-polling in one request.
type rounds struct {
	s      *Source
	ctx    context.Context // ends every round: cancelled by stop
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	leaders map[int]*leaderRounds
}

// leaderRounds is the rounds to one broker.
type leaderRounds struct {
	wake chan struct{} // a token when asks are queued

	mu      sync.Mutex
	asks    []*fetchAsk
	members int // partitions whose fetcher fetches from this broker (join, leave)
	// expect holds the partitions the last round answered with no
	// records, which ask again at once: the next round waits for them
	// (up to roundWait), so that partitions at their end keep fetching in
	// one request instead of splitting into rounds that alternate.
	expect map[int32]bool

	// Only the rounds' goroutine uses these.
	short time.Duration  // the wait of a round that leaves partitions out
	quiet map[int32]bool // the last round's partitions, if it found no records for any
}

// fetchAsk is one partition's fetch in a round.
type fetchAsk struct {
	partition int32
	offset    int64
	wait      time.Duration
	// done receives the answer; buffered, so that a round never waits on
	// a fetcher that stopped waiting.
	done chan fetchAnswer
}

// fetchAnswer is what a round returns to one ask: the partition's part of
// the response, or why the round failed.
type fetchAnswer struct {
	part *fetchapi.ResponsePartition
	err  error
}

func newRounds(s *Source, base context.Context) *rounds {
	r := &rounds{s: s, leaders: make(map[int]*leaderRounds)}
	r.ctx, r.cancel = context.WithCancel(base)
	return r
}

// stop ends the rounds in flight; their asks fail with context.Canceled.
func (r *rounds) stop() { r.cancel() }

// wait returns when every round's goroutine has returned. Call it after stop,
// once no fetcher can join any more.
func (r *rounds) wait() { r.wg.Wait() }

// join makes a fetcher a member of the rounds to broker id, starting them
// when it is the first, and returns them.
func (r *rounds) join(id int) *leaderRounds {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.leaders[id]
	if !ok {
		l = &leaderRounds{wake: make(chan struct{}, 1)}
		r.leaders[id] = l
		r.wg.Go(func() { r.run(l) })
	}
	l.mu.Lock()
	l.members++
	l.mu.Unlock()
	return l
}

// leave ends the membership of partition's fetcher of l (its join).
func (r *rounds) leave(l *leaderRounds, partition int) {
	l.mu.Lock()
	l.members--
	l.settled(int32(partition))
	l.mu.Unlock()
}

// settled records that the round need not wait for partition any more:
// it asked, or it left. It wakes the round when it was the last one
// expected. l.mu is held.
func (l *leaderRounds) settled(partition int32) {
	if !l.expect[partition] {
		return
	}
	delete(l.expect, partition)
	if len(l.expect) == 0 {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// fetch asks l's next round for partition from offset, waiting on the broker
// up to wait, and returns the partition's part of its response.
func (r *rounds) fetch(ctx context.Context, l *leaderRounds, partition int, offset int64, wait time.Duration) (*fetchapi.ResponsePartition, error) {
	q := &fetchAsk{partition: int32(partition), offset: offset, wait: wait, done: make(chan fetchAnswer, 1)}
	l.mu.Lock()
	l.asks = append(l.asks, q)
	l.settled(q.partition)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	select {
	case a := <-q.done:
		return a.part, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-r.ctx.Done():
		return nil, r.ctx.Err()
	}
}

// run sends l's rounds, one at a time, until stop.
func (r *rounds) run(l *leaderRounds) {
	// The Transport routes each round to the leader it reads from the
	// cluster's metadata; a new one after a failed round reads it afresh,
	// as a fetcher's reconnect does.
	tr := r.s.transport()
	defer func() { tr.CloseIdleConnections() }()
	// settle bounds the wait for the partitions expected to ask again: one
	// that does not (it got stuck before asking) is left for the round
	// after.
	settle := time.NewTimer(roundWait)
	settle.Stop()
	defer settle.Stop()
	for {
		select {
		case <-settle.C:
			l.mu.Lock()
			clear(l.expect)
			l.mu.Unlock()
		case <-r.ctx.Done():
			l.mu.Lock()
			asks := l.asks
			l.asks = nil
			l.mu.Unlock()
			for _, q := range asks {
				q.done <- fetchAnswer{err: r.ctx.Err()}
			}
			return
		case <-l.wake:
		}
		l.mu.Lock()
		if len(l.expect) > 0 {
			l.mu.Unlock()
			continue
		}
		asks, members := l.asks, l.members
		l.asks = nil
		l.mu.Unlock()
		if len(asks) == 0 {
			continue
		}
		settle.Stop()
		ok := r.round(tr, l, asks, members)
		l.mu.Lock()
		expecting := len(l.expect) > 0
		l.mu.Unlock()
		if expecting {
			settle.Reset(roundWait)
		}
		if !ok {
			tr.CloseIdleConnections()
			tr = r.s.transport()
		}
	}
}

// round sends asks in one Fetch request through tr and answers each. It
// reports whether the broker answered every partition without an error.
func (r *rounds) round(tr *kafka.Transport, l *leaderRounds, asks []*fetchAsk, members int) bool {
	s := r.s
	wait := asks[0].wait
	parts := make([]fetchapi.RequestPartition, len(asks))
	for i, q := range asks {
		wait = min(wait, q.wait)
		parts[i] = fetchapi.RequestPartition{
			Partition:          q.partition,
			CurrentLeaderEpoch: -1,
			FetchOffset:        q.offset,
			LogStartOffset:     -1,
			PartitionMaxBytes:  int32(s.cfg.FetchMaxBytes),
		}
	}
	if len(asks) < members {
		if l.short > 0 && l.sameQuiet(asks) {
			l.short = min(2*l.short, roundWaitMax)
		} else {
			l.short = roundWait
		}
		wait = min(wait, l.short)
	}
	clear(l.quiet)
	s.fetchRequests.Add(1)
	s.fetchPartitions.Add(int64(len(asks)))
	for n := int32(len(asks)); ; {
		if w := s.widestRound.Load(); n <= w || s.widestRound.CompareAndSwap(w, n) {
			break
		}
	}
	req := &fetchapi.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(wait / time.Millisecond),
		MinBytes:       1,
		MaxBytes:       int32(min(int64(s.cfg.FetchMaxBytes)*int64(len(asks)), math.MaxInt32)),
		IsolationLevel: int8(s.cfg.isolationLevel()),
		// A full fetch without a fetch session.
		SessionID:    -1,
		SessionEpoch: -1,
		Topics:       []fetchapi.RequestTopic{{Topic: s.cfg.Topic, Partitions: parts}},
	}
	ctx, cancel := context.WithTimeout(r.ctx, wait+s.cfg.NetworkTimeout)
	m, err := tr.RoundTrip(ctx, kafka.TCP(s.cfg.Brokers...), req)
	cancel()
	if err == nil {
		if res := m.(*fetchapi.Response); res.ErrorCode != 0 {
			err = kafka.Error(res.ErrorCode)
		} else {
			return l.answer(asks, res)
		}
	}
	for _, q := range asks {
		q.done <- fetchAnswer{err: err}
	}
	return false
}

// answer hands each ask its partition's part of res, and reports whether
// every part came without an error. The partitions answered with no
// records are expected to ask again at once (expect).
func (l *leaderRounds) answer(asks []*fetchAsk, res *fetchapi.Response) bool {
	byPartition := make(map[int32]*fetchAsk, len(asks))
	for _, q := range asks {
		byPartition[q.partition] = q
	}
	ok, quiet := true, true
	for ti := range res.Topics {
		for pi := range res.Topics[ti].Partitions {
			part := &res.Topics[ti].Partitions[pi]
			q := byPartition[part.Partition]
			if q == nil {
				continue
			}
			delete(byPartition, part.Partition)
			ok = ok && part.ErrorCode == 0
			empty := part.ErrorCode == 0 && part.RecordSet.Records == nil
			quiet = quiet && empty
			if empty {
				l.mu.Lock()
				if l.expect == nil {
					l.expect = make(map[int32]bool)
				}
				l.expect[part.Partition] = true
				l.mu.Unlock()
			}
			q.done <- fetchAnswer{part: part}
		}
	}
	for _, q := range byPartition {
		q.done <- fetchAnswer{err: fmt.Errorf("dedup: kafka: fetch response without partition %d", q.partition)}
		ok = false
	}
	if ok && quiet {
		if l.quiet == nil {
			l.quiet = make(map[int32]bool, len(asks))
		}
		for _, q := range asks {
			l.quiet[q.partition] = true
		}
	}
	return ok
}

// sameQuiet reports whether asks are the partitions of the last round, which
// found no records for any of them.
func (l *leaderRounds) sameQuiet(asks []*fetchAsk) bool {
	if len(asks) != len(l.quiet) {
		return false
	}
	for _, q := range asks {
		if !l.quiet[q.partition] {
			return false
		}
	}
	return true
}
