package consumertest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/sleep"
)

// NewMessage returns a message with payload and, when key is not empty, the
// Idempotency-Key header the engine reads by default.
func NewMessage(key, payload string) *consumer.Message {
	h := consumer.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return &consumer.Message{Payload: []byte(payload), Header: h, Origin: consumer.Origin{Transport: "test", Topic: "test"}}
}

// Settlement is how a Delivery ended.
type Settlement string

// The settlements of a Delivery.
const (
	Unsettled    Settlement = ""
	Acked        Settlement = "acked"
	Nakked       Settlement = "nakked"
	DeadLettered Settlement = "dead_lettered" // DeadLetter, then Ack
)

// Delivery is an in-memory consumer.Delivery that records how it was
// settled, for tests of processors and handlers. It is safe for concurrent
// use.
type Delivery struct {
	msg     *consumer.Message
	attempt int

	mu          sync.Mutex
	fail        Errors
	settled     Settlement
	settles     int
	nakDelay    time.Duration
	deadLetter  *consumer.DeadLetter
	deadLetters int
	heartbeats  int
	done        chan struct{} // closed at the first Ack or Nak
}

// Errors are what a Delivery's calls return instead of succeeding, to test
// how a processor copes with a broker that refuses them. A nil field is a
// call that succeeds. A call that fails records nothing: the broker did not
// take it, so a failed Ack or Nak leaves the delivery unsettled.
type Errors struct {
	Ack        error
	Nak        error
	Heartbeat  error
	DeadLetter error // consumer.ErrNoDeadLetter: no dead-letter destination
}

// NewDelivery returns the attempt-th delivery (from 1) of m.
func NewDelivery(m *consumer.Message, attempt int) *Delivery {
	return &Delivery{msg: m, attempt: max(attempt, 1), done: make(chan struct{})}
}

var _ consumer.Delivery = (*Delivery)(nil)

// FailWith makes the delivery's calls return the errors of e from now on,
// and returns d.
func (d *Delivery) FailWith(e Errors) *Delivery {
	d.mu.Lock()
	d.fail = e
	d.mu.Unlock()
	return d
}

// Message returns the message.
func (d *Delivery) Message() *consumer.Message { return d.msg }

// Attempt returns the delivery's attempt number.
func (d *Delivery) Attempt() int { return d.attempt }

// Ack settles the delivery as done (as dead-lettered after DeadLetter).
func (d *Delivery) Ack(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail.Ack != nil {
		return d.fail.Ack
	}
	if d.deadLetter != nil {
		d.settle(DeadLettered)
	} else {
		d.settle(Acked)
	}
	return nil
}

// Nak settles the delivery as not done, to be delivered again after delay.
func (d *Delivery) Nak(_ context.Context, delay time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail.Nak != nil {
		return d.fail.Nak
	}
	d.settle(Nakked)
	if d.settles == 1 {
		d.nakDelay = delay
	}
	return nil
}

// settle records s; d.mu is held.
func (d *Delivery) settle(s Settlement) {
	d.settles++
	if d.settles == 1 {
		d.settled = s
		close(d.done)
	}
}

// Heartbeat counts a heartbeat.
func (d *Delivery) Heartbeat(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail.Heartbeat != nil {
		return d.fail.Heartbeat
	}
	d.heartbeats++
	return nil
}

// DeadLetter records dl; the delivery is settled by the Ack that follows.
func (d *Delivery) DeadLetter(_ context.Context, dl consumer.DeadLetter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail.DeadLetter != nil {
		return d.fail.DeadLetter
	}
	d.deadLetter = &dl
	d.deadLetters++
	return nil
}

// Settled returns how the delivery was first settled (Unsettled until then)
// and how many times it was settled in all: a processor settles a delivery
// exactly once.
func (d *Delivery) Settled() (Settlement, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.settled, d.settles
}

// NakDelay returns the delay of the Nak that settled the delivery.
func (d *Delivery) NakDelay() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nakDelay
}

// DeadLetterInfo returns what DeadLetter was last called with, or nil.
func (d *Delivery) DeadLetterInfo() *consumer.DeadLetter {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.deadLetter
}

// Heartbeats returns how many heartbeats the delivery got.
func (d *Delivery) Heartbeats() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.heartbeats
}

// Done is closed when the delivery is first settled.
func (d *Delivery) Done() <-chan struct{} { return d.done }

// ExpectAcked fails t unless the delivery was settled exactly once, with an
// Ack and no dead letter.
func (d *Delivery) ExpectAcked(t testing.TB) {
	t.Helper()
	d.expect(t, Acked)
}

// ExpectNakked fails t unless the delivery was settled exactly once, with a
// Nak, and returns the Nak's delay.
func (d *Delivery) ExpectNakked(t testing.TB) time.Duration {
	t.Helper()
	d.expect(t, Nakked)
	return d.NakDelay()
}

// ExpectDeadLettered fails t unless the message was dead-lettered exactly
// once and the delivery then settled exactly once, with an Ack; it returns
// what the message was dead-lettered with.
func (d *Delivery) ExpectDeadLettered(t testing.TB) consumer.DeadLetter {
	t.Helper()
	d.expect(t, DeadLettered)
	return *d.DeadLetterInfo()
}

// ExpectUnsettled fails t if the delivery was settled.
func (d *Delivery) ExpectUnsettled(t testing.TB) {
	t.Helper()
	d.expect(t, Unsettled)
}

// expect fails t unless the delivery was settled as want exactly once (not
// at all for Unsettled), and dead-lettered once for DeadLettered and never
// otherwise.
func (d *Delivery) expect(t testing.TB, want Settlement) {
	t.Helper()
	d.mu.Lock()
	st, n, dead, dl, delay := d.settled, d.settles, d.deadLetters, d.deadLetter, d.nakDelay
	d.mu.Unlock()
	wantN, wantDead := 1, 0
	switch want {
	case Unsettled:
		wantN = 0
	case DeadLettered:
		wantDead = 1
	}
	if st == want && n == wantN && dead == wantDead {
		return
	}
	got := string(st)
	switch {
	case st == Unsettled:
		got = "unsettled"
	case st == Nakked:
		got += fmt.Sprintf(" (delay %s)", delay)
	}
	if dl != nil {
		got += fmt.Sprintf(", dead-lettered %d times (last %+v)", dead, *dl)
	}
	name := string(want)
	if want == Unsettled {
		name = "unsettled"
	}
	payload := d.msg.Payload
	if len(payload) > 40 {
		payload = payload[:40]
	}
	t.Fatalf("consumertest: delivery of %q (attempt %d): %s, settled %d times; want %s, settled %d times", payload, d.attempt, got, n, name, wantN)
}

// Source is an in-memory consumer.Source: it delivers the messages it was
// given, in order, delivers a nakked one again (attempt + 1) after its
// delay, and returns from Consume once every message is acked or
// dead-lettered, so that a Worker's Run over it returns when the work is
// done. A real source runs until it is stopped; this one ends, so a test can
// read the results after Run. It delivers one message at a time, or runs of
// them (InRuns).
type Source struct {
	msgs []*consumer.Message
	run  int // messages per run; 0 delivers one at a time through Process

	mu         sync.Mutex
	deliveries []*Delivery
}

// NewSource returns a Source that delivers msgs.
func NewSource(msgs ...*consumer.Message) *Source {
	s := &Source{}
	for i, m := range msgs {
		if m.Origin.Transport == "" {
			m.Origin = consumer.Origin{Transport: "test", Topic: "test"}
		}
		m.Origin.Offset = int64(i)
		s.msgs = append(s.msgs, m)
	}
	return s
}

var _ consumer.Source = (*Source)(nil)

// InRuns makes the Source hand its messages to Runner.ProcessBatch in
// contiguous runs of up to n, as a broker's fetch does, so that a
// BatchHandler is called with several messages at once. The messages of a
// run that are nakked are delivered again (attempt + 1) as a run of their
// own, in order and after the longest of their delays, before the next
// messages: the way a Kafka partition's lane retries. It returns s.
func (s *Source) InRuns(n int) *Source {
	s.run = max(n, 1)
	return s
}

// Consume delivers every message until it is acked or dead-lettered, or
// until ctx is cancelled; it returns nil either way.
func (s *Source) Consume(ctx context.Context, r consumer.Runner) error {
	work := context.WithoutCancel(ctx)
	size := max(s.run, 1)
	for start := 0; start < len(s.msgs); start += size {
		run := s.msgs[start:min(start+size, len(s.msgs))]
		for attempt := 1; len(run) > 0; attempt++ {
			if ctx.Err() != nil {
				return nil
			}
			ds := make([]consumer.Delivery, len(run))
			s.mu.Lock()
			for i, m := range run {
				d := NewDelivery(m, attempt)
				s.deliveries = append(s.deliveries, d)
				ds[i] = d
			}
			s.mu.Unlock()
			r.Prepare(work, ds)
			if s.run == 0 {
				r.Process(work, ds[0])
			} else {
				r.ProcessBatch(work, ds)
			}
			var again []*consumer.Message
			var delay time.Duration
			for i, cd := range ds {
				d := cd.(*Delivery)
				switch st, _ := d.Settled(); st {
				case Acked, DeadLettered:
				case Nakked:
					again = append(again, run[i])
					delay = max(delay, d.NakDelay())
				default:
					return fmt.Errorf("consumertest: the processor returned without settling message %d (%s)", run[i].Origin.Offset, strconv.Quote(string(run[i].Payload)))
				}
			}
			if len(again) > 0 && !sleep.For(ctx, delay) {
				return nil
			}
			run = again
		}
	}
	return nil
}

// Deliveries returns every delivery made so far, in order.
func (s *Source) Deliveries() []*Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.deliveries)
}
