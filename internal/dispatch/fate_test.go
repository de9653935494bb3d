package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

func TestDecide(t *testing.T) {
	live := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	policy := dispatch.RetryPolicy{MaxAttempts: 3, BackoffInitial: time.Second, BackoffMax: 4 * time.Second}
	unlimited := dispatch.RetryPolicy{BackoffInitial: time.Second, BackoffMax: 4 * time.Second}
	plain := errors.New("transient")
	perm := dispatch.Permanent(plain)
	later := dispatch.RetryAfter(time.Minute, nil)

	tests := []struct {
		name    string
		ctx     context.Context
		err     error
		attempt int
		p       dispatch.RetryPolicy
		want    dispatch.Action
		reason  string
		// delay is the exact delay of a retry, or, when backoff is set, the
		// backoff before its jitter (up to a fifth either way).
		delay   time.Duration
		backoff bool
	}{
		{name: "success", ctx: live, err: nil, attempt: 1, p: policy, want: dispatch.ActAck},
		{name: "success on the last attempt", ctx: live, err: nil, attempt: 3, p: policy, want: dispatch.ActAck},
		{name: "success after cancellation", ctx: cancelled, err: nil, attempt: 1, p: policy, want: dispatch.ActAck},
		{name: "failure after cancellation", ctx: cancelled, err: plain, attempt: 1, p: policy, want: dispatch.ActRedeliver},
		{name: "permanent after cancellation", ctx: cancelled, err: perm, attempt: 1, p: policy, want: dispatch.ActRedeliver},
		{name: "permanent", ctx: live, err: perm, attempt: 1, p: policy, want: dispatch.ActDeadLetter, reason: dispatch.ReasonPermanent},
		{name: "wrapped permanent", ctx: live, err: fmt.Errorf("charge: %w", perm), attempt: 1, p: policy, want: dispatch.ActDeadLetter, reason: dispatch.ReasonPermanent},
		{name: "permanent on the last attempt", ctx: live, err: perm, attempt: 3, p: policy, want: dispatch.ActDeadLetter, reason: dispatch.ReasonPermanent},
		{name: "last attempt", ctx: live, err: plain, attempt: 3, p: policy, want: dispatch.ActDeadLetter, reason: dispatch.ReasonMaxAttempts},
		{name: "past the last attempt", ctx: live, err: plain, attempt: 7, p: policy, want: dispatch.ActDeadLetter, reason: dispatch.ReasonMaxAttempts},
		{name: "retry-after on the last attempt", ctx: live, err: later, attempt: 3, p: policy, want: dispatch.ActDeadLetter, reason: dispatch.ReasonMaxAttempts},
		{name: "retry-after", ctx: live, err: later, attempt: 1, p: policy, want: dispatch.ActRetry, delay: time.Minute},
		{name: "wrapped retry-after", ctx: live, err: fmt.Errorf("rate limited: %w", later), attempt: 2, p: policy, want: dispatch.ActRetry, delay: time.Minute},
		{name: "first failure", ctx: live, err: plain, attempt: 1, p: policy, want: dispatch.ActRetry, delay: time.Second, backoff: true},
		{name: "second failure doubles", ctx: live, err: plain, attempt: 2, p: policy, want: dispatch.ActRetry, delay: 2 * time.Second, backoff: true},
		{name: "no limit", ctx: live, err: plain, attempt: 100, p: unlimited, want: dispatch.ActRetry, delay: 4 * time.Second, backoff: true},
		{name: "zero policy retries at once", ctx: live, err: plain, attempt: 5, p: dispatch.RetryPolicy{}, want: dispatch.ActRetry, delay: 0},
		{name: "panic", ctx: live, err: &consumer.PanicError{Value: "boom"}, attempt: 1, p: policy, want: dispatch.ActRetry, delay: time.Second, backoff: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := dispatch.Decide(tt.ctx, tt.err, tt.attempt, tt.p)
			if f.Action != tt.want || f.Reason != tt.reason {
				t.Fatalf("Decide = %v %q, want %v %q", f.Action, f.Reason, tt.want, tt.reason)
			}
			if tt.want != dispatch.ActRetry {
				if f.Delay != 0 {
					t.Fatalf("%v with delay %s, want none", f.Action, f.Delay)
				}
				return
			}
			if !tt.backoff {
				if f.Delay != tt.delay {
					t.Fatalf("delay %s, want %s", f.Delay, tt.delay)
				}
				return
			}
			if lo, hi := tt.delay-tt.delay/5, tt.delay+tt.delay/5; f.Delay < lo || f.Delay > hi {
				t.Fatalf("delay %s, want %s ±20%%", f.Delay, tt.delay)
			}
		})
	}
}

func TestRetryPolicyDelayIsBackoff(t *testing.T) {
	p := dispatch.RetryPolicy{BackoffInitial: 100 * time.Millisecond, BackoffMax: time.Second}
	for attempt, base := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 9: time.Second} {
		if d := p.Delay(attempt); d < base-base/5 || d > base+base/5 {
			t.Errorf("Delay(%d) = %s, want %s ±20%%", attempt, d, base)
		}
	}
}

func TestActionString(t *testing.T) {
	for a, want := range map[dispatch.Action]string{
		dispatch.ActAck: "ack", dispatch.ActRedeliver: "redeliver", dispatch.ActRetry: "retry",
		dispatch.ActDeadLetter: "dead_letter", dispatch.Action(9): "Action(9)",
	} {
		if got := a.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(a), got, want)
		}
	}
}

// listSource hands its deliveries to the runner one after the other, then
// returns, which ends the Worker's Run.
type listSource []consumer.Delivery

func (s listSource) Consume(ctx context.Context, r consumer.Runner) error {
	for _, d := range s {
		r.Process(ctx, d)
	}
	return nil
}

// A handler without a middleware retries under Config.Retry: its backoff,
// and its attempt limit, after which the message is dead-lettered.
func TestWorkerDirectUsesConfigRetry(t *testing.T) {
	first := consumertest.NewDelivery(consumertest.NewMessage("", "a"), 1)
	second := consumertest.NewDelivery(consumertest.NewMessage("", "b"), 2)
	last := consumertest.NewDelivery(consumertest.NewMessage("", "c"), 3)
	w := dispatch.NewWorker(dispatch.Config{Retry: dispatch.RetryPolicy{MaxAttempts: 3, BackoffInitial: 10 * time.Second, BackoffMax: time.Minute}})
	err := w.Handle("h", listSource{first, second, last}, consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) {
		return nil, errors.New("transient")
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	for _, c := range []struct {
		d      *consumertest.Delivery
		lo, hi time.Duration
	}{{first, 8 * time.Second, 12 * time.Second}, {second, 16 * time.Second, 24 * time.Second}} {
		if st, n := c.d.Settled(); st != consumertest.Nakked || n != 1 || c.d.NakDelay() < c.lo || c.d.NakDelay() > c.hi {
			t.Errorf("attempt %d: settled %s %d times, delay %s, want one nak within [%s, %s]", c.d.Attempt(), st, n, c.d.NakDelay(), c.lo, c.hi)
		}
	}
	dl := last.DeadLetterInfo()
	if st, n := last.Settled(); st != consumertest.DeadLettered || n != 1 || dl == nil || dl.Reason != dispatch.ReasonMaxAttempts || dl.Attempts != 3 {
		t.Errorf("attempt 3: settled %s %d times, dead letter %+v, want dead-lettered once (max_attempts, 3 attempts)", st, n, dl)
	}
}
