package idempotency

import (
	"context"
	"errors"

	"github.com/idemkit/dedupworker/consumer"
)

// deadLetterOwned publishes d to the dead-letter destination and returns the
// dead_lettered completion to store and true; when publishing failed it
// releases the claim, naks d for a retry and returns false.
func (p *processor) deadLetterOwned(ctx context.Context, d consumer.Delivery, cl *Claim, key, reason string, herr error, attempt int) (completing, bool) {
	m := d.Message()
	dl := consumer.DeadLetter{Reason: reason, Err: herr.Error(), Key: key, Handler: p.name, Attempts: attempt}
	if !p.publishDeadLetter(ctx, d, dl) {
		p.release(ctx, cl)
		p.retryDeadLetter(ctx, d, attempt)
		return completing{}, false
	}
	p.log.Error("message dead-lettered", "origin", m.Origin.String(), "reason", reason, "attempts", attempt, "err", herr)
	meta := map[string]string{"reason": reason, "error": truncate(herr.Error(), 1024)}
	return p.completion(d, cl, RecordOutcomeDeadLettered, nil, meta, consumer.OutcomeDeadLettered), true
}

// publishDeadLetter sends dl and reports whether the message may now be
// acked: true when published, or when there is no destination (logged: the
// record still says dead_lettered); false when publishing failed.
func (p *processor) publishDeadLetter(ctx context.Context, d consumer.Delivery, dl consumer.DeadLetter) bool {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	err := d.DeadLetter(dctx, dl)
	switch {
	case err == nil:
		return true
	case errors.Is(err, consumer.ErrNoDeadLetter):
		p.log.Error("no dead-letter destination configured: the message is recorded as dead-lettered and acked",
			"origin", d.Message().Origin.String(), "reason", dl.Reason, "err", dl.Err)
		return true
	}
	p.log.Error("dead-letter publish failed; will retry", "origin", d.Message().Origin.String(), "reason", dl.Reason, "err", err)
	return false
}

// retryDeadLetter naks d, whose dead-letter publish failed, for another
// attempt after the handler backoff of attempt.
func (p *processor) retryDeadLetter(ctx context.Context, d consumer.Delivery, attempt int) {
	p.settle(ctx, d, consumer.OutcomeFailed, nak(p.retry.Delay(attempt)))
}
