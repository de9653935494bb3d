package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/idemkit/dedupworker/consumer"
)

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
