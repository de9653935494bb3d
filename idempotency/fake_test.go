package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// fakeDelivery is an in-memory consumer.Delivery that records how it was
// settled.
type fakeDelivery struct {
	msg     *consumer.Message
	attempt int
	dlErr   error // returned by DeadLetter

	heartbeats atomic.Int32

	mu       sync.Mutex
	acks     int
	naks     []time.Duration
	dead     []consumer.DeadLetter
	settledC chan struct{}
}

func newDelivery(key string, payload string) *fakeDelivery {
	h := consumer.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return &fakeDelivery{
		msg: &consumer.Message{
			Payload: []byte(payload),
			Header:  h,
			Origin:  consumer.Origin{Transport: "fake", Topic: "t", Offset: 1},
		},
		attempt:  1,
		settledC: make(chan struct{}, 16),
	}
}

func (d *fakeDelivery) Message() *consumer.Message { return d.msg }
func (d *fakeDelivery) Attempt() int               { return d.attempt }

func (d *fakeDelivery) Ack(context.Context) error {
	d.mu.Lock()
	d.acks++
	d.mu.Unlock()
	d.settledC <- struct{}{}
	return nil
}

func (d *fakeDelivery) Nak(_ context.Context, delay time.Duration) error {
	d.mu.Lock()
	d.naks = append(d.naks, delay)
	d.mu.Unlock()
	d.settledC <- struct{}{}
	return nil
}

func (d *fakeDelivery) Heartbeat(context.Context) error {
	d.heartbeats.Add(1)
	return nil
}

func (d *fakeDelivery) DeadLetter(_ context.Context, dl consumer.DeadLetter) error {
	if d.dlErr != nil {
		return d.dlErr
	}
	d.mu.Lock()
	d.dead = append(d.dead, dl)
	d.mu.Unlock()
	return nil
}

// state returns acks, naks and dead letters so far.
func (d *fakeDelivery) state() (acks int, naks []time.Duration, dead []consumer.DeadLetter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.acks, append([]time.Duration(nil), d.naks...), append([]consumer.DeadLetter(nil), d.dead...)
}

// expectAck asserts the delivery was settled exactly once, with an ack.
func (d *fakeDelivery) expectAck(t *testing.T) {
	t.Helper()
	acks, naks, _ := d.state()
	if acks != 1 || len(naks) != 0 {
		t.Fatalf("want exactly one ack and no nak, got %d acks, naks %v", acks, naks)
	}
}

// expectNak asserts the delivery was settled exactly once, with a nak, and
// returns its delay.
func (d *fakeDelivery) expectNak(t *testing.T) time.Duration {
	t.Helper()
	acks, naks, _ := d.state()
	if acks != 0 || len(naks) != 1 {
		t.Fatalf("want exactly one nak and no ack, got %d acks, naks %v", acks, naks)
	}
	return naks[0]
}

// countingHandler counts runs and returns what fn returns.
type countingHandler struct {
	runs atomic.Int32
	fn   func(ctx context.Context, m *consumer.Message) ([]byte, error)
}

func (h *countingHandler) Handle(ctx context.Context, m *consumer.Message) ([]byte, error) {
	h.runs.Add(1)
	if h.fn == nil {
		return []byte("ok:" + string(m.Payload)), nil
	}
	return h.fn(ctx, m)
}

var errBoom = errors.New("boom")

// outcomes records hook outcomes.
type outcomes struct {
	mu sync.Mutex
	m  map[consumer.Outcome]int
}

func (o *outcomes) OnOutcome(_, _ string, oc consumer.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[consumer.Outcome]int{}
	}
	o.m[oc]++
}

func (o *outcomes) get(oc consumer.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.m[oc]
}
