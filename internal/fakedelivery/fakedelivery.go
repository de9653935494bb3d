// Package fakedelivery is an in-memory consumer.Delivery for tests of
// processors: it records acks, naks, heartbeats and dead letters.
package fakedelivery

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// Delivery is an in-memory consumer.Delivery that records how it was
// settled, for tests of processors.
type Delivery struct {
	Msg *consumer.Message
	// AttemptN is what Attempt returns.
	AttemptN int
	// DeadLetterErr is returned by DeadLetter when set.
	DeadLetterErr error
	// Heartbeats counts Heartbeat calls.
	Heartbeats atomic.Int32

	mu   sync.Mutex
	acks int
	naks []time.Duration
	dead []consumer.DeadLetter
}

func New(key string, payload string) *Delivery {
	h := consumer.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return &Delivery{
		Msg: &consumer.Message{
			Payload: []byte(payload),
			Header:  h,
			Origin:  consumer.Origin{Transport: "fake", Topic: "t", Offset: 1},
		},
		AttemptN: 1,
	}
}

func (d *Delivery) Message() *consumer.Message { return d.Msg }
func (d *Delivery) Attempt() int               { return d.AttemptN }

func (d *Delivery) Ack(context.Context) error {
	d.mu.Lock()
	d.acks++
	d.mu.Unlock()
	return nil
}

func (d *Delivery) Nak(_ context.Context, delay time.Duration) error {
	d.mu.Lock()
	d.naks = append(d.naks, delay)
	d.mu.Unlock()
	return nil
}

func (d *Delivery) Heartbeat(context.Context) error {
	d.Heartbeats.Add(1)
	return nil
}

func (d *Delivery) DeadLetter(_ context.Context, dl consumer.DeadLetter) error {
	if d.DeadLetterErr != nil {
		return d.DeadLetterErr
	}
	d.mu.Lock()
	d.dead = append(d.dead, dl)
	d.mu.Unlock()
	return nil
}

// State returns acks, naks and dead letters so far.
func (d *Delivery) State() (acks int, naks []time.Duration, dead []consumer.DeadLetter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.acks, append([]time.Duration(nil), d.naks...), append([]consumer.DeadLetter(nil), d.dead...)
}

// ExpectAck asserts the delivery was settled exactly once, with an ack.
func (d *Delivery) ExpectAck(t *testing.T) {
	t.Helper()
	acks, naks, _ := d.State()
	if acks != 1 || len(naks) != 0 {
		t.Fatalf("want exactly one ack and no nak, got %d acks, naks %v", acks, naks)
	}
}

// ExpectNak asserts the delivery was settled exactly once, with a nak, and
// returns its delay.
func (d *Delivery) ExpectNak(t *testing.T) time.Duration {
	t.Helper()
	acks, naks, _ := d.State()
	if acks != 0 || len(naks) != 1 {
		t.Fatalf("want exactly one nak and no ack, got %d acks, naks %v", acks, naks)
	}
	return naks[0]
}
