package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
)

// notifying is a delivery whose source learns when its run's handlers are
// done (consumer.RunHandledNotifier); notified records each notice.
type notifying struct {
	*consumertest.Delivery
	notified func()
}

func (d *notifying) RunHandled() { d.notified() }

// TestProcessBatchReportsHandlersDone: ProcessBatch tells the run's source
// once, after the handler returned and before any completion is stored,
// when every message of the run has a result to store; it tells nothing
// when a message failed, or when a message waits behind one of the run that
// owns its key, since something of the call is then left to run. A plain
// handler (not a BatchHandler) is told of for a run of one, the runs a
// Kafka lane hands it; a longer run of it is processed a delivery at a
// time, and told of never.
func TestProcessBatchReportsHandlersDone(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		keys   []string
		fail   string
		plain  bool
		notify bool
	}{
		{name: "all done", keys: []string{"a", "b", "c"}, notify: true},
		{name: "a run of one", keys: []string{"a"}, notify: true},
		{name: "a failed message", keys: []string{"a", "b", "c"}, fail: "b"},
		{name: "a repeat held back", keys: []string{"a", "b", "a"}},
		{name: "plain, a run of one", keys: []string{"a"}, plain: true, notify: true},
		{name: "plain, a failed run of one", keys: []string{"a"}, fail: "a", plain: true},
		{name: "plain, a run of three", keys: []string{"a", "b", "c"}, plain: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := context.Background()
			var (
				mu       sync.Mutex
				returned bool // the handler's call returned
				notices  []string
			)
			h := consumer.BatchFunc(func(_ context.Context, msgs []*consumer.Message, results []consumer.Result) {
				for i, m := range msgs {
					k := m.Header.Get("Idempotency-Key")
					if k == tc.fail {
						results[i].Err = errors.New("failed")
						continue
					}
					results[i].Value = []byte("done-" + k)
				}
				mu.Lock()
				returned = true
				mu.Unlock()
			})
			p := f.processor(t, h)
			if tc.plain {
				p = f.processor(t, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
					results := make([]consumer.Result, 1)
					h(ctx, []*consumer.Message{m}, results)
					return results[0].Value, results[0].Err
				}))
			}
			ds := make([]consumer.Delivery, len(tc.keys))
			cds := make([]*consumertest.Delivery, len(tc.keys))
			for i, k := range tc.keys {
				cds[i] = consumertest.NewDelivery(consumertest.NewMessage(k, "payload-"+k), 1)
				cds[i].Message().Origin.Offset = int64(i)
				ds[i] = cds[i]
			}
			// Only the run's first delivery is the source's notifier.
			ds[0] = &notifying{Delivery: cds[0], notified: func() {
				mu.Lock()
				defer mu.Unlock()
				state := fmt.Sprintf("handler returned %v", returned)
				for _, k := range tc.keys {
					rec, err := f.store.Get(ctx, idempotency.EffectiveKey("orders", k))
					if err != nil || rec == nil {
						state += fmt.Sprintf("; %s: %v %v", k, rec, err)
						continue
					}
					state += fmt.Sprintf("; %s %s", k, rec.State)
				}
				notices = append(notices, state)
			}}
			p.ProcessBatch(ctx, ds)

			mu.Lock()
			defer mu.Unlock()
			if !tc.notify {
				if len(notices) != 0 {
					t.Fatalf("notified %v, want no notice", notices)
				}
			} else {
				want := "handler returned true"
				for _, k := range tc.keys {
					want += fmt.Sprintf("; %s %s", k, idempotency.StateClaimed)
				}
				if len(notices) != 1 || notices[0] != want {
					t.Fatalf("notices %q, want one: %q (the handler returned, nothing completed yet)", notices, want)
				}
			}
			for i, k := range tc.keys {
				if k == tc.fail {
					cds[i].ExpectNakked(t)
					continue
				}
				cds[i].ExpectAcked(t)
			}
			for _, k := range tc.keys {
				rec, err := f.store.Get(ctx, idempotency.EffectiveKey("orders", k))
				if k == tc.fail {
					continue
				}
				if err != nil || rec == nil || rec.State != idempotency.StateCompleted {
					t.Errorf("%s: record %+v %v after ProcessBatch, want COMPLETED", k, rec, err)
				}
			}
		})
	}
}
