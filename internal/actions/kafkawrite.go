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
// queue, and when it returns, everything queued for the partitions that
// are then idle goes in one call. It adds no delay, writes grow exactly
// when the broker is the bottleneck, a partition never waits for another's
// write to start, and a call carries up to maxMsgs messages per partition.
//
// A partition is in at most one call at a time, a caller's messages for it
// stay contiguous and in order in that call, and kafka-go keeps a call's
// order within a partition, so a caller that waits for each write before
// the next (a lane) keeps its order. The partition of a message is
// computed as the writer's partitionHash computes it, over the partition
// count it saw last; before its first write, or for a writer NewKafkaWriter
// did not make, every message is in one group (one call in flight at a
// time). After the topic gains partitions, until a call has seen the new
// count, two groups may name one partition: a key's messages still share a
// group and keep their order, but a run's messages of different keys may
// then land in that partition in two calls at once. kafka.Hash spreads
// keyless messages round-robin over every partition, so a run with a
// keyless message is written whole, in one call, as a group of its own.
//
// Each call runs on a goroutine of its own that ends when the call has
// returned and the next call, if any, has started.
type coalescingWriter struct {
	w       KafkaWriter
	hash    *partitionHash // nil: one group
	maxMsgs int

	group kafka.Hash            // computes groups; safe for concurrent use with keys
	seq   atomic.Pointer[[]int] // 0..n-1, the partitions of the last count

	mu      sync.Mutex
	pending map[int][]*writePart // by group, in arrival order
	busy    map[int]bool         // groups in a call
}

// writePart is one caller's messages for one group, answered once on done
// (buffered for every part of the call: a call never waits for a caller
// that left).
type writePart struct {
	ctx  context.Context
	msgs []kafka.Message
	idx  []int // the messages' indexes in the caller's run; nil: all of it
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
	c := &coalescingWriter{w: w, maxMsgs: kafkaFlightMessages, pending: map[int][]*writePart{}, busy: map[int]bool{}}
	if kw, ok := w.(*kafka.Writer); ok {
		c.hash, _ = kw.Balancer.(*partitionHash)
	}
	return c
}

// keyless is the group of the runs that hold a message without a key.
const keyless = -1

// groupOf returns the group of a message with a key.
func (c *coalescingWriter) groupOf(key []byte) int {
	if c.hash == nil {
		return 0
	}
	n := int(c.hash.n.Load())
	if n <= 0 {
		return 0
	}
	seq := c.seq.Load()
	if seq == nil || len(*seq) != n {
		s := make([]int, n)
		for i := range s {
			s[i] = i
		}
		c.seq.Store(&s)
		seq = &s
	}
	return c.group.Balance(kafka.Message{Key: key}, *seq...)
}

// WriteMessages writes msgs, each with other callers' messages or alone,
// and returns nil, or kafka.WriteErrors of len(msgs) with an entry for each
// message that failed. It returns ctx's cause when ctx ends first; the
// messages may still be written then, as with a kafka.Writer, so the caller
// must not modify msgs or their contents after the call.
func (c *coalescingWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	groups := make([]int, len(msgs))
	one := true
	for i := range msgs {
		if msgs[i].Key == nil {
			one, groups[0] = true, keyless
			break
		}
		groups[i] = c.groupOf(msgs[i].Key)
		one = one && groups[i] == groups[0]
	}
	var parts []*writePart
	var byGroup map[int]*writePart
	if one {
		// The common case (a lane's run to one partition, or a run with a
		// keyless message): the run is the part.
		parts = []*writePart{{ctx: ctx, msgs: msgs}}
		byGroup = map[int]*writePart{groups[0]: parts[0]}
	} else {
		byGroup = map[int]*writePart{}
		for i, g := range groups {
			p := byGroup[g]
			if p == nil {
				p = &writePart{ctx: ctx}
				byGroup[g] = p
				parts = append(parts, p)
			}
			p.msgs = append(p.msgs, msgs[i])
			p.idx = append(p.idx, i)
		}
	}
	done := make(chan partResult, len(parts))
	c.mu.Lock()
	for g, p := range byGroup {
		p.done = done
		c.pending[g] = append(c.pending[g], p)
	}
	c.launch()
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
			for j := range r.part.msgs {
				i := j
				if r.part.idx != nil {
					i = r.part.idx[j]
				}
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

// launch starts one call with the queued parts of every group not in a
// call, taking per group the parts of callers still waiting, in order, up
// to maxMsgs messages (the first part whatever its size). Call it with
// c.mu held.
func (c *coalescingWriter) launch() {
	var batch []*writePart
	var groups []int
	for g, queue := range c.pending {
		if c.busy[g] {
			continue
		}
		n, i, took := 0, 0, false
		for ; i < len(queue); i++ {
			p := queue[i]
			if p.ctx.Err() != nil {
				p.done <- partResult{part: p, err: context.Cause(p.ctx)}
				continue
			}
			if took && n+len(p.msgs) > c.maxMsgs {
				break
			}
			batch = append(batch, p)
			n += len(p.msgs)
			took = true
		}
		rest := copy(queue, queue[i:])
		clear(queue[rest:])
		if rest == 0 {
			delete(c.pending, g)
		} else {
			c.pending[g] = queue[:rest]
		}
		if took {
			c.busy[g] = true
			groups = append(groups, g)
		}
	}
	if len(batch) > 0 {
		go c.fly(groups, batch)
	}
}

// fly writes batch, then frees its groups and starts the next call.
func (c *coalescingWriter) fly(groups []int, batch []*writePart) {
	c.write(batch)
	c.mu.Lock()
	for _, g := range groups {
		delete(c.busy, g)
	}
	c.launch()
	c.mu.Unlock()
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
