package actions

import (
	"context"
	"errors"
	"math/bits"
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
// the batching a linger would buy, without its wait. Close it when done.
func NewKafkaWriter(addr net.Addr, topic string, tr kafka.RoundTripper, ioTimeout time.Duration) *KafkaBatchWriter {
	w := &KafkaBatchWriter{hash: &partitionHash{}}
	for i := range w.sized {
		w.sized[i] = &kafka.Writer{
			Addr:         addr,
			Topic:        topic,
			Balancer:     w.hash,
			RequiredAcks: kafka.RequireAll,
			BatchTimeout: kafkaWriterBatchTimeout,
			BatchSize:    batchSizeOf(i),
			WriteTimeout: ioTimeout,
			ReadTimeout:  ioTimeout,
			Transport:    tr,
		}
	}
	return w
}

// batchClasses is how many kafka.Writers a KafkaBatchWriter holds: BatchSize
// 1, 2, 4, ..., 64, and kafkaFlightMessages.
const batchClasses = 8

// batchSizeOf returns the BatchSize of a KafkaBatchWriter's writer i.
func batchSizeOf(i int) int {
	if i == batchClasses-1 {
		return kafkaFlightMessages
	}
	return 1 << i
}

// batchClassOf returns the index of the writer with the smallest BatchSize
// that holds n messages (n <= 1: the first), or of the largest.
func batchClassOf(n int) int {
	if n <= 1 {
		return 0
	}
	return min(bits.Len(uint(n-1)), batchClasses-1)
}

// KafkaBatchWriter is NewKafkaWriter's writer: kafka.Writers that differ
// only in BatchSize, sharing one balancer and one transport. kafka-go gives
// every partition batch of a call room for BatchSize messages when it
// starts it, so a call goes to the writer whose BatchSize is the smallest
// that holds the messages the call has for any one partition: that batch
// is still one produce request, without the room a fixed BatchSize of
// kafkaFlightMessages sets aside for every call. A call with more than
// kafkaFlightMessages messages for one partition is split as one
// kafka.Writer splits it, into produce requests of up to that many, in
// order. kafka.Writer's retries, leader changes and per-message errors are
// each writer's own.
//
// Two calls with messages for one partition, in flight at once, may go to
// two writers and land in either order: a caller that needs the order of
// its calls waits for each before the next (coalescingWriter never has two
// calls in flight for one partition).
type KafkaBatchWriter struct {
	hash  *partitionHash
	sized [batchClasses]*kafka.Writer
}

// WriteMessages writes msgs with the writer sized for all of them (an upper
// bound of what any partition gets), and returns what kafka.Writer's
// WriteMessages returns.
func (w *KafkaBatchWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	return w.writeSized(ctx, len(msgs), msgs)
}

// writeSized writes msgs with the writer sized for perPartition messages,
// which must be at least the number of msgs any one partition gets, or more
// than one produce request carries them.
func (w *KafkaBatchWriter) writeSized(ctx context.Context, perPartition int, msgs []kafka.Message) error {
	return w.sized[batchClassOf(perPartition)].WriteMessages(ctx, msgs...)
}

// Close flushes and closes every writer, and returns their errors joined.
func (w *KafkaBatchWriter) Close() error {
	errs := make([]error, 0, len(w.sized))
	for _, kw := range w.sized {
		errs = append(errs, kw.Close())
	}
	return errors.Join(errs...)
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
	// kafkaFlightMessages bounds the messages of one coalesced call for one
	// partition, and is the largest BatchSize of NewKafkaWriter's writers,
	// so that a coalesced call for one partition is one produce request
	// (kafka-go's default batch size, and the Kafka source's default
	// batch_size, so a lane's full run is one too). A single caller's share
	// larger than this is still written whole.
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
// time). A run is grouped over one count (groupRun), so its messages for a
// partition are always in one call. While the count changes (the writer's
// first write, and after the topic gains partitions, until a call has seen
// the new count), two groups may name one partition: a run's messages
// still share a group and keep their order, but two callers' runs may then
// land in that partition in two calls at once. kafka.Hash spreads
// keyless messages round-robin over every partition, so a run with a
// keyless message is written whole, in one call, as a group of its own.
//
// Each call runs on a goroutine of its own that ends when the call has
// returned and the next call, if any, has started.
type coalescingWriter struct {
	w       KafkaWriter
	sized   *KafkaBatchWriter // w, when NewKafkaWriter made it; else nil
	hash    *partitionHash    // nil: one group
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
	// keyless is how many of msgs have no key (in the keyless group only).
	keyless int
	done    chan partResult
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
	if kw, ok := w.(*KafkaBatchWriter); ok {
		c.sized, c.hash = kw, kw.hash
	}
	return c
}

// keyless is the group of the runs that hold a message without a key.
const keyless = -1

// partitions is the partition count messages are grouped over: the one
// the writer saw last, 0 before its first write or without a
// partitionHash (one group).
func (c *coalescingWriter) partitions() int {
	if c.hash == nil {
		return 0
	}
	return int(c.hash.n.Load())
}

// groupOf returns the group of a message with a key, over n partitions.
func (c *coalescingWriter) groupOf(key []byte, n int) int {
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
	groups, one := c.groupRun(msgs)
	var parts []*writePart
	var byGroup map[int]*writePart
	if one {
		// The common case (a lane's run to one partition, or a run with a
		// keyless message): the run is the part.
		parts = []*writePart{{ctx: ctx, msgs: msgs}}
		byGroup = map[int]*writePart{groups[0]: parts[0]}
		if groups[0] == keyless {
			for i := range msgs {
				if msgs[i].Key == nil {
					parts[0].keyless++
				}
			}
		}
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

// groupRun returns the group of each message of a run, or, when one is
// set, the run's one group in groups[0]: keyless when a message has no
// key. The partition count is read once for the run: read for each
// message, a count the writer learns meanwhile (its first write, another
// caller's) would put the run's first messages in group 0 and the rest in
// their partitions' groups, calls that may fly at once and land one
// partition's messages of the run, a key's among them, out of order.
func (c *coalescingWriter) groupRun(msgs []kafka.Message) (groups []int, one bool) {
	groups = make([]int, len(msgs))
	n := c.partitions()
	one = true
	for i := range msgs {
		if msgs[i].Key == nil {
			groups[0] = keyless
			return groups[:1:1], true
		}
		groups[i] = c.groupOf(msgs[i].Key, n)
		one = one && groups[i] == groups[0]
	}
	return groups, one
}

// launch starts one call with the queued parts of every group not in a
// call, taking per group the parts of callers still waiting, in order, up
// to maxMsgs messages (the first part whatever its size). Call it with
// c.mu held.
func (c *coalescingWriter) launch() {
	var batch []*writePart
	var groups []int
	most := 0             // the most messages of one keyed group
	keyed, spread := 0, 0 // the keyless group's messages with and without a key
	for g, queue := range c.pending {
		if c.busy[g] {
			continue
		}
		n, nokey, i, took := 0, 0, 0, false
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
			nokey += p.keyless
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
			if g == keyless {
				keyed, spread = n-nokey, nokey
			} else {
				most = max(most, n)
			}
		}
	}
	if len(batch) > 0 {
		go c.fly(groups, batch, most+keyed+c.roundRobinShare(spread))
	}
}

// roundRobinShare bounds how many of n keyless messages of one call the
// writer's balancer puts in one partition. kafka.Hash spreads keyless
// messages round-robin, one partition after the other; the keyless group
// is in at most one call at a time, so when this coalescingWriter is the
// writer's only user, a call's keyless messages take consecutive turns and
// no partition gets more than n over the partition count, rounded up.
// Before the writer has seen the count the bound is n; after the topic
// has gained partitions, the count last seen is smaller than the one the
// writer balances over, so the bound still holds. Were
// another caller's keyless messages to interleave, a partition could get
// more, and kafka-go would write the excess in a further produce request.
func (c *coalescingWriter) roundRobinShare(n int) int {
	if n == 0 || c.hash == nil {
		return n
	}
	p := int(c.hash.n.Load())
	if p <= 0 {
		return n
	}
	return (n + p - 1) / p
}

// fly writes batch, then frees its groups and starts the next call.
func (c *coalescingWriter) fly(groups []int, batch []*writePart, most int) {
	c.write(batch, most)
	c.mu.Lock()
	for _, g := range groups {
		delete(c.busy, g)
	}
	c.launch()
	c.mu.Unlock()
}

// write sends batch's parts in one call and answers each with its share of
// the result. most bounds the messages the call has for one partition
// (launch: the largest keyed group, plus the keyless group's keyed
// messages and its share of each partition's keyless ones); a partition
// that gets more (while two groups name one partition, see
// coalescingWriter) has the excess written in a further produce request.
func (c *coalescingWriter) write(batch []*writePart, most int) {
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
	var err error
	if c.sized != nil {
		err = c.sized.writeSized(ctx, most, msgs)
	} else {
		err = c.w.WriteMessages(ctx, msgs...)
	}
	expired := ctx.Err() != nil
	cancel()
	var werrs kafka.WriteErrors
	if err != nil && !expired && len(batch) > 1 && !(errors.As(err, &werrs) && len(werrs) == len(msgs)) {
		// One error for the whole call (kafka-go refuses a call with a
		// message larger than BatchBytes before writing any): write each
		// caller's share alone, so that each gets its own answer and no
		// caller fails for another's message.
		for _, p := range batch {
			c.write([]*writePart{p}, len(p.msgs))
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
