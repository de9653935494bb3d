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
var ErrSettled = errors.New("kafka: delivery already settled")

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

	first consumer.Message // the message, in the first attempt's allocation

	mu    sync.Mutex
	state settlement
	delay time.Duration

	call procCall // its Process call on the member's procPool
}

var _ consumer.Delivery = (*delivery)(nil)

func newDelivery(p *partition, m *kafka.Message, attempt int) *delivery {
	d := &delivery{p: p, raw: m, attempt: attempt}
	d.first = consumer.Message{
		Key:     m.Key,
		Payload: m.Value,
		Header:  newHeader(m.Headers),
		Origin: consumer.Origin{
			Transport: "kafka",
			Topic:     m.Topic,
			Partition: m.Partition,
			Offset:    m.Offset,
		},
	}
	d.msg = &d.first
	return d
}

// newHeader converts Kafka headers, in order, with three allocations however
// many there are: the map, one slice backing every value list, and one
// string holding every value.
func newHeader(hs []kafka.Header) consumer.Header {
	if len(hs) == 0 {
		return nil
	}
	n := 0
	for _, kh := range hs {
		n += len(kh.Value)
	}
	var b strings.Builder
	b.Grow(n)
	for _, kh := range hs {
		b.Write(kh.Value)
	}
	all := b.String()
	vals := make([]string, len(hs))
	h := make(consumer.Header, len(hs))
	off := 0
	for i, kh := range hs {
		vals[i] = all[off : off+len(kh.Value)]
		off += len(kh.Value)
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
	return &delivery{p: d.p, msg: d.msg, raw: d.raw, attempt: d.attempt + 1}
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
	d.p.finish(d.msg.Origin.Offset)
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
