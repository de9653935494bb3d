package kafkasource

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
)

// ErrSettled is returned by Ack and Nak on a delivery that is already
// settled.
var ErrSettled = errors.New("dedup: kafka: delivery already settled")

type settlement int

const (
	unsettled settlement = iota
	settledAck
	settledNak
)

// delivery is one attempt at one message. A retry in place is a new
// delivery with Attempt()+1 over the same message.
type delivery struct {
	p       *partition
	msg     *consumer.Message // first's, shared by the retries
	raw     *kafka.Message
	attempt int
	cost    int64 // what the message's fetch acquired for it (budget)

	first consumer.Message // the message, in the first attempt's allocation

	mu    sync.Mutex
	state settlement
	delay time.Duration

	call procCall // its Process call on the member's procPool
}

var (
	_ consumer.Delivery           = (*delivery)(nil)
	_ consumer.RunHandledNotifier = (*delivery)(nil)
)

// newDeliveries returns the first attempts of a dispatched chunk's
// messages, allocated together: one slab of deliveries and the chunk's
// headers (headerSpace). Each delivery references its kafka.Message in
// chunk, a block of its fetch that holds no other chunk's messages
// (blocks), for its retries too: the chunk, like the slab, lives until
// its last delivery is done, and nothing else of the fetch does.
func newDeliveries(p *partition, chunk []kafka.Message) []*delivery {
	slab := make([]delivery, len(chunk))
	ds := make([]*delivery, len(chunk))
	hs := newHeaderSpace(chunk)
	for i := range chunk {
		d := &slab[i]
		d.init(p, &chunk[i], hs.header(chunk[i].Headers))
		ds[i] = d
	}
	return ds
}

// init makes d the first attempt at m, whose headers are h.
func (d *delivery) init(p *partition, m *kafka.Message, h consumer.Header) {
	d.p, d.raw, d.attempt = p, m, 1
	d.cost = messageCost(m)
	d.first = consumer.Message{
		Key:     m.Key,
		Payload: m.Value,
		Header:  h,
		Origin: consumer.Origin{
			Transport: "kafka",
			Topic:     m.Topic,
			Partition: m.Partition,
			Offset:    m.Offset,
		},
	}
	d.msg = &d.first
}

// headerSpace converts the Kafka headers of several messages, in order,
// with one allocation per message (its map) and two for all of them: one
// string holding every value and one slice backing every value list. Each
// message's lists are capped at their length, so appending to one never
// writes into another's.
type headerSpace struct {
	all  string
	vals []string
}

func newHeaderSpace(ms []kafka.Message) headerSpace {
	n, size := 0, 0
	for i := range ms {
		n += len(ms[i].Headers)
		for _, kh := range ms[i].Headers {
			size += len(kh.Value)
		}
	}
	if n == 0 {
		return headerSpace{}
	}
	var b strings.Builder
	b.Grow(size)
	for i := range ms {
		for _, kh := range ms[i].Headers {
			b.Write(kh.Value)
		}
	}
	return headerSpace{all: b.String(), vals: make([]string, n)}
}

// header converts hs, the headers of the next message newHeaderSpace was
// given; nil when there are none.
func (s *headerSpace) header(hs []kafka.Header) consumer.Header {
	if len(hs) == 0 {
		return nil
	}
	vals := s.vals[:len(hs):len(hs)]
	s.vals = s.vals[len(hs):]
	h := make(consumer.Header, len(hs))
	for i, kh := range hs {
		vals[i] = s.all[:len(kh.Value)]
		s.all = s.all[len(kh.Value):]
		if prev, ok := h[kh.Key]; ok {
			h[kh.Key] = append(prev, vals[i]) // a repeated key: its own slice from now on
			continue
		}
		h[kh.Key] = vals[i : i+1 : i+1]
	}
	return h
}

// retry returns the next attempt of the same message.
func (d *delivery) retry() *delivery {
	return &delivery{p: d.p, msg: d.msg, raw: d.raw, attempt: d.attempt + 1, cost: d.cost}
}

func (d *delivery) Message() *consumer.Message { return d.msg }

// Attempt counts in-place retries of this message by this member, from 1.
// A message redelivered after a rebalance or restart starts again at 1.
func (d *delivery) Attempt() int { return d.attempt }

// Ack marks the offset finished: the partition's committed offset may move
// past it.
func (d *delivery) Ack(context.Context) error {
	d.mu.Lock()
	if d.state != unsettled {
		d.mu.Unlock()
		return ErrSettled
	}
	d.state = settledAck
	d.mu.Unlock()
	d.p.finish(d.msg.Origin.Offset, d.cost)
	return nil
}

// Nak asks for the message again after delay: its lane (the partition, or
// the key under key ordering) waits, then processes it again with
// Attempt()+1. If the partition is revoked or the source stops meanwhile,
// the message is left uncommitted for the next owner.
func (d *delivery) Nak(_ context.Context, delay time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != unsettled {
		return ErrSettled
	}
	d.state = settledNak
	d.delay = max(delay, 0)
	return nil
}

// RunHandled tells the lane running d's run that the run's handlers are
// done, so that it may start its next run while this one's results are
// stored. It does nothing unless d is the first delivery of a running
// ProcessBatch call.
func (d *delivery) RunHandled() { d.call.handled() }

// Heartbeat is a no-op: the consumer group heartbeats on its own, and Kafka
// has no per-message timer.
func (d *delivery) Heartbeat(context.Context) error { return nil }

// DeadLetter produces the message to the dead-letter topic with its key,
// payload and headers plus the headers describing dl. It waits for every
// in-sync replica to acknowledge the write.
func (d *delivery) DeadLetter(ctx context.Context, dl consumer.DeadLetter) error {
	w := d.p.g.m.dlq
	if w == nil {
		return consumer.ErrNoDeadLetter
	}
	return w.write(ctx, d.raw, dl.Headers(d.msg.Origin))
}

func (d *delivery) outcome() (settlement, time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state, d.delay
}
