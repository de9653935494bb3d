package actions

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

// kafkaWriterBatchTimeout is the BatchTimeout of NewKafkaWriter's writer:
// the shortest positive duration (kafka-go reads 0 as its default of one
// second). ForwardKafka coalesces runs before they reach the writer
// (coalescingWriter), so a batch is produced as soon as WriteMessages has
// added it, not after a linger that waits for messages no caller is about
// to add.
const kafkaWriterBatchTimeout = time.Nanosecond

// NewKafkaWriter returns the writer of a forward.kafka action: every message
// to the partition its key hashes to (kafka.Hash: same key, same partition,
// so per-key order survives the relay), acknowledged by every in-sync
// replica, produced without lingering. ioTimeout bounds each produce and
// metadata request; tr carries the destination's TLS and SASL (nil: kafka-go's
// default transport). ForwardKafka coalesces the runs that concurrent calls
// send to one partition while an earlier write to it is in flight, which is
// the batching a linger would buy, without its wait.
func NewKafkaWriter(addr net.Addr, topic string, tr kafka.RoundTripper, ioTimeout time.Duration) *kafka.Writer {
	return &kafka.Writer{
		Addr:         addr,
		Topic:        topic,
		Balancer:     &partitionHash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: kafkaWriterBatchTimeout,
		BatchSize:    kafkaFlightMessages,
		WriteTimeout: ioTimeout,
		ReadTimeout:  ioTimeout,
		Transport:    tr,
	}
}

// partitionHash is kafka.Hash that remembers how many partitions the writer
// last balanced a message over, so that coalescingWriter can tell which
// partition a message goes to before it hands it to the writer.
type partitionHash struct {
	kafka.Hash
	n atomic.Int32
}

// Balance is kafka.Hash's, recording len(partitions).
func (h *partitionHash) Balance(msg kafka.Message, partitions ...int) int {
	h.n.Store(int32(len(partitions)))
	return h.Hash.Balance(msg, partitions...)
}

// Limits of coalescingWriter.
const (
	// kafkaFlightMessages bounds the messages of one coalesced call, and is
	// NewKafkaWriter's BatchSize, so that a coalesced call for one
	// partition is one produce request (kafka-go's default batch size, and
	// the Kafka source's default batch_size, so a lane's full run is one
	// too). A single caller's share larger than this is still written whole.
	kafkaFlightMessages = 100
	// kafkaFlightTimeout bounds a coalesced call whose callers have no
	// deadline of their own.
	kafkaFlightTimeout = 30 * time.Second
)

// coalescingWriter writes the runs of concurrent callers to the writer
// partition by partition, Nagle's way: a run's messages for a partition
// with no write in flight go at once; those for a partition that has one
// queue, and when it returns the next write takes everything queued for
// that partition in one call. It adds no delay, writes grow exactly when
// the broker is the bottleneck, and partitions never wait for each other.
//
// A caller's messages for one partition stay contiguous and in order in a
// single call, and kafka-go keeps a call's order within a partition, so a
// caller that waits for each write before the next (a lane) keeps its order.
// The partition of a message is computed as the writer's partitionHash
// computes it, over the partition count it saw last; before its first
// write, or for a writer NewKafkaWriter did not make, every message is in
// one group (one write in flight at a time). Keyless messages, which
// kafka.Hash spreads round-robin, form a group of their own.
//
// Flushers are goroutines, one per group with work, that end when the
// group's queue is empty.
type coalescingWriter struct {
	w       KafkaWriter
	hash    *partitionHash // nil: one group
	maxMsgs int

	mu     sync.Mutex
	groups map[int]*writeGroup
	seq    []int // 0..n-1 for the grouping's Balance calls
	group  kafka.Hash
}

// writeGroup is the queue of one partition (or of keyless messages).
type writeGroup struct {
	pending []*writePart
	busy    bool // a flusher owns the group
}

// writePart is one caller's messages for one group, answered once on done
// (buffered for every part of the call: a flusher never waits for a caller
// that left).
type writePart struct {
	ctx  context.Context
	msgs []kafka.Message
	idx  []int // the messages' indexes in the caller's run
	done chan partResult
}

// partResult answers a part: one error for all its messages, or one per
// message (errs, of len(msgs)).
type partResult struct {
	part *writePart
	err  error
	errs kafka.WriteErrors
}

func newCoalescingWriter(w KafkaWriter) *coalescingWriter {
	c := &coalescingWriter{w: w, maxMsgs: kafkaFlightMessages, groups: map[int]*writeGroup{}}
	if kw, ok := w.(*kafka.Writer); ok {
		c.hash, _ = kw.Balancer.(*partitionHash)
	}
	return c
}

// keyless is the group of messages without a key.
const keyless = -1

// groupOf returns the group of a message; call with c.mu held.
func (c *coalescingWriter) groupOf(m *kafka.Message) int {
	if c.hash == nil {
		return 0
	}
	if m.Key == nil {
		return keyless
	}
	n := int(c.hash.n.Load())
	if n <= 0 {
		return 0
	}
	if len(c.seq) != n {
		c.seq = make([]int, n)
		for i := range c.seq {
			c.seq[i] = i
		}
	}
	return c.group.Balance(kafka.Message{Key: m.Key}, c.seq...)
}

// WriteMessages writes msgs, each with other callers' messages for its
// partition or alone, and returns nil, or kafka.WriteErrors of len(msgs)
// with an entry for each message that failed. It returns ctx's cause when
// ctx ends first; the messages may still be written then, as with a
// kafka.Writer.
func (c *coalescingWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	c.mu.Lock()
	var parts []*writePart
	byGroup := map[int]*writePart{}
	for i := range msgs {
		g := c.groupOf(&msgs[i])
		p := byGroup[g]
		if p == nil {
			p = &writePart{ctx: ctx}
			byGroup[g] = p
			parts = append(parts, p)
		}
		p.msgs = append(p.msgs, msgs[i])
		p.idx = append(p.idx, i)
	}
	done := make(chan partResult, len(parts))
	for g, p := range byGroup {
		p.done = done
		wg := c.groups[g]
		if wg == nil {
			wg = &writeGroup{}
			c.groups[g] = wg
		}
		wg.pending = append(wg.pending, p)
		if !wg.busy {
			wg.busy = true
			go c.flusher(g)
		}
	}
	c.mu.Unlock()
	var werrs kafka.WriteErrors
	for range parts {
		select {
		case r := <-done:
			if r.err == nil && r.errs == nil {
				continue
			}
			if werrs == nil {
				werrs = make(kafka.WriteErrors, len(msgs))
			}
			for j, i := range r.part.idx {
				if r.errs != nil {
					werrs[i] = r.errs[j]
				} else {
					werrs[i] = r.err
				}
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	if werrs == nil {
		return nil
	}
	return werrs
}

// next takes the queued parts of group g whose callers still wait, in
// order, up to maxMsgs messages (the first part whatever its size). With
// none it releases the group.
func (c *coalescingWriter) next(g int) []*writePart {
	c.mu.Lock()
	defer c.mu.Unlock()
	wg := c.groups[g]
	var batch []*writePart
	n, i := 0, 0
	for ; i < len(wg.pending); i++ {
		p := wg.pending[i]
		if p.ctx.Err() != nil {
			p.done <- partResult{part: p, err: context.Cause(p.ctx)}
			continue
		}
		if len(batch) > 0 && n+len(p.msgs) > c.maxMsgs {
			break
		}
		batch = append(batch, p)
		n += len(p.msgs)
	}
	rest := copy(wg.pending, wg.pending[i:])
	clear(wg.pending[rest:])
	wg.pending = wg.pending[:rest]
	if len(batch) == 0 {
		delete(c.groups, g)
	}
	return batch
}

// flusher writes group g's queued parts until its queue is empty.
func (c *coalescingWriter) flusher(g int) {
	for {
		batch := c.next(g)
		if len(batch) == 0 {
			return
		}
		c.write(batch)
	}
}

// write sends batch's parts in one call and answers each with its share of
// the result.
func (c *coalescingWriter) write(batch []*writePart) {
	msgs := batch[0].msgs
	if len(batch) > 1 {
		n := 0
		for _, p := range batch {
			n += len(p.msgs)
		}
		msgs = make([]kafka.Message, 0, n)
		for _, p := range batch {
			msgs = append(msgs, p.msgs...)
		}
	}
	ctx, cancel := flightContext(batch)
	err := c.w.WriteMessages(ctx, msgs...)
	expired := ctx.Err() != nil
	cancel()
	var werrs kafka.WriteErrors
	if err != nil && !expired && len(batch) > 1 && !(errors.As(err, &werrs) && len(werrs) == len(msgs)) {
		// One error for the whole call (kafka-go refuses a call with a
		// message larger than BatchBytes before writing any): write each
		// caller's share alone, so that each gets its own answer and no
		// caller fails for another's message.
		for _, p := range batch {
			c.write([]*writePart{p})
		}
		return
	}
	perMessage := err != nil && errors.As(err, &werrs) && len(werrs) == len(msgs)
	off := 0
	for _, p := range batch {
		r := partResult{part: p}
		switch {
		case err == nil:
		case perMessage:
			r.errs = werrs[off : off+len(p.msgs) : off+len(p.msgs)]
		default:
			r.err = err
		}
		off += len(p.msgs)
		p.done <- r
	}
}

// flightContext is the context of a coalesced call: no caller's
// cancellation stops the others' messages; it ends at the latest deadline
// of its callers, or after kafkaFlightTimeout when one has none.
func flightContext(batch []*writePart) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, p := range batch {
		d, ok := p.ctx.Deadline()
		if !ok {
			return context.WithTimeout(context.Background(), kafkaFlightTimeout)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}
