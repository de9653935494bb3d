package natssource_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// TestPending: Pending reports the consumer's backlog while Consume runs.
// With every handler stuck at MaxAckPending nothing more is delivered, and
// messages published then still show up, through the consumer's info;
// once the handlers finish the backlog is 0, and a source that stopped
// reports none.
func TestPending(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		e.publish(t, 20)
		release := make(chan struct{})
		s := newSeen()
		src := newSource(t, e, natssource.Config{MaxAckPending: 2})
		if p, ok := src.Pending(); ok {
			t.Fatalf("Pending before Consume = %+v, true", p)
		}
		r := run(t, dispatch.Config{}, src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			select {
			case <-release:
				s.add(string(m.Payload), 1)
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}), dispatch.WithConcurrency(2))

		want := func(n uint64) func() error {
			return func() error {
				p, ok := src.Pending()
				if !ok || p.Messages != n {
					return fmt.Errorf("Pending = %+v, %v; want %d messages", p, ok, n)
				}
				if time.Since(p.Seen) > time.Minute {
					return fmt.Errorf("Pending seen at %v", p.Seen)
				}
				return nil
			}
		}
		// Two delivered, both stuck.
		testenv.EventuallyNil(t, 30*time.Second, "the backlog behind the stuck handlers", want(18))
		// Nothing is delivered now: only the consumer's info sees these.
		e.publish(t, 5)
		testenv.EventuallyNil(t, 30*time.Second, "the backlog published while nothing is delivered", want(23))
		close(release)
		testenv.Eventually(t, 30*time.Second, "every message handled", func() bool { return s.count() == 25 })
		testenv.EventuallyNil(t, 30*time.Second, "no backlog once everything is handled", want(0))
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if p, ok := src.Pending(); ok {
			t.Fatalf("Pending after Consume returned = %+v, true", p)
		}
	})
}
