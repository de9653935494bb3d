package dispatch

import (
	"context"
	"strconv"
	"time"
)

// Dead-letter reasons that Decide gives (DeadLetter.Reason).
const (
	// ReasonPermanent: the handler returned a Permanent error.
	ReasonPermanent = "permanent_error"
	// ReasonMaxAttempts: the message failed its last allowed attempt.
	ReasonMaxAttempts = "max_attempts"
)

// RetryPolicy says how failed deliveries are retried and when they are
// dead-lettered. The zero value retries for ever with no delay;
// DefaultRetryPolicy is what a Worker and the engine start from.
type RetryPolicy struct {
	// MaxAttempts is how many attempts a message gets: a failure of attempt
	// MaxAttempts or later is dead-lettered with ReasonMaxAttempts. Zero
	// means no limit.
	MaxAttempts int
	// BackoffInitial is the delay before the first retry; it doubles for
	// every later attempt, up to BackoffMax (see Backoff). Zero means retry
	// at once.
	BackoffInitial time.Duration
	// BackoffMax caps the delay.
	BackoffMax time.Duration
}

// DefaultRetryPolicy returns the policy of a handler that sets none: no
// attempt limit, a backoff of 1s doubling to 5m. The deduplication engine
// adds its own limit (idempotency.WithMaxAttempts).
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{BackoffInitial: time.Second, BackoffMax: 5 * time.Minute}
}

// Delay returns the backoff before retrying after attempt (1-based) failed:
// Backoff(attempt, p.BackoffInitial, p.BackoffMax). Every retry delay of a
// processor is computed here.
func (p RetryPolicy) Delay(attempt int) time.Duration {
	return Backoff(attempt, p.BackoffInitial, p.BackoffMax)
}

// Action is what a processor does with a delivery once its handler
// returned.
type Action int

// Actions, as Decide chooses them.
const (
	// ActAck: the handler succeeded. The engine stores the outcome first.
	ActAck Action = iota
	// ActRedeliver: the run was cancelled (shutdown, revocation): hand the
	// message back at once so another worker takes it.
	ActRedeliver
	// ActRetry: nak with Fate.Delay; the engine releases its claim first.
	ActRetry
	// ActDeadLetter: publish to the dead-letter destination with
	// Fate.Reason, then ack.
	ActDeadLetter
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case ActAck:
		return "ack"
	case ActRedeliver:
		return "redeliver"
	case ActRetry:
		return "retry"
	case ActDeadLetter:
		return "dead_letter"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Fate is the decision Decide makes about one delivery.
type Fate struct {
	Action Action
	// Delay is the redelivery delay of ActRetry.
	Delay time.Duration
	// Reason is the dead-letter reason of ActDeadLetter: ReasonPermanent or
	// ReasonMaxAttempts.
	Reason string
}

// Decide is the one place that turns a handler's error into a delivery's
// fate, for every processor:
//
//   - nil: ack;
//   - any error once ctx is cancelled: redeliver at once (the run was cut
//     short; it is not the handler's failure);
//   - a Permanent error: dead-letter with ReasonPermanent;
//   - any error on attempt p.MaxAttempts or later: dead-letter with
//     ReasonMaxAttempts;
//   - a RetryAfter error: retry after its delay;
//   - any other error: retry after p.Delay(attempt).
//
// attempt is 1-based: the delivery's Attempt, or the claim's attempt count
// under the engine.
func Decide(ctx context.Context, err error, attempt int, p RetryPolicy) Fate {
	switch {
	case err == nil:
		return Fate{Action: ActAck}
	case ctx.Err() != nil:
		return Fate{Action: ActRedeliver}
	case IsPermanent(err):
		return Fate{Action: ActDeadLetter, Reason: ReasonPermanent}
	case p.MaxAttempts > 0 && attempt >= p.MaxAttempts:
		return Fate{Action: ActDeadLetter, Reason: ReasonMaxAttempts}
	}
	if d, ok := RetryDelay(err); ok {
		return Fate{Action: ActRetry, Delay: d}
	}
	return Fate{Action: ActRetry, Delay: p.Delay(attempt)}
}
