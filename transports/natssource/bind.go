package natssource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/sleep"
)

// bind returns the durable consumer, creating it when it does not exist. A
// missing stream, a consumer that cannot be used, or a closed connection is
// an error; anything else (a timeout, a reconnect) is retried with a backoff
// until ctx is cancelled.
func (s *Source) bind(ctx context.Context, defaultPending int) (jetstream.Consumer, error) {
	for attempt := 1; ; attempt++ {
		cons, err := s.bindOnce(ctx, defaultPending)
		if err == nil {
			return cons, nil
		}
		var fatal *fatalError
		if errors.As(err, &fatal) || s.js.Conn().IsClosed() {
			return nil, err
		}
		delay := dispatch.Backoff(attempt, 200*time.Millisecond, 5*time.Second)
		s.log.Warn("binding the consumer failed; retrying", "attempt", attempt, "delay", delay, "err", err)
		if !sleep.For(ctx, delay) {
			return nil, ctx.Err()
		}
	}
}

// fatalError marks a bind error that retrying cannot fix.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

func (s *Source) bindOnce(ctx context.Context, defaultPending int) (jetstream.Consumer, error) {
	c, cancel := s.withTimeout(ctx)
	defer cancel()
	cons, err := s.js.Consumer(c, s.cfg.Stream, s.cfg.Consumer)
	switch {
	case err == nil:
		if cons, err = s.reconcile(c, cons, defaultPending); err != nil {
			return nil, err
		}
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, &fatalError{s.goneErr(err)}
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if s.cfg.BindOnly {
			return nil, &fatalError{fmt.Errorf("%w (BindOnly is set, so it is not created)", s.goneErr(err))}
		}
		cons, err = s.create(c, defaultPending)
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("dedup: nats: looking up consumer %q of stream %q: %w", s.cfg.Consumer, s.cfg.Stream, err)
	}
	if err := s.checkDeadLetter(c, cons.CachedInfo()); err != nil {
		return nil, err
	}
	return cons, nil
}

func (s *Source) create(ctx context.Context, defaultPending int) (jetstream.Consumer, error) {
	cfg := jetstream.ConsumerConfig{
		Durable:       s.cfg.Consumer,
		Description:   "dedupworker",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: cmp.Or(s.cfg.MaxAckPending, defaultPending),
		FilterSubject: s.cfg.Subject,
		ReplayPolicy:  jetstream.ReplayInstantPolicy,
	}
	cons, err := s.js.CreateConsumer(ctx, s.cfg.Stream, cfg)
	switch {
	case err == nil:
		s.log.Info("created the durable consumer", "ack_wait", cfg.AckWait, "max_ack_pending", cfg.MaxAckPending, "filter", cfg.FilterSubject)
		return cons, nil
	case errors.Is(err, jetstream.ErrConsumerExists):
		// Another worker created it meanwhile, maybe with another
		// configuration: use it as any existing consumer.
		cons, err = s.js.Consumer(ctx, s.cfg.Stream, s.cfg.Consumer)
		if err != nil {
			return nil, fmt.Errorf("dedup: nats: consumer %q of stream %q: %w", s.cfg.Consumer, s.cfg.Stream, err)
		}
		return s.reconcile(ctx, cons, defaultPending)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, &fatalError{s.goneErr(err)}
	default:
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.Code == 400 {
			// A configuration the server refuses does not get better.
			return nil, &fatalError{fmt.Errorf("dedup: nats: creating consumer %q of stream %q: %w", s.cfg.Consumer, s.cfg.Stream, err)}
		}
		return nil, fmt.Errorf("dedup: nats: creating consumer %q of stream %q: %w", s.cfg.Consumer, s.cfg.Stream, err)
	}
}

// reconcile checks an existing consumer (checkExisting) and makes it follow
// Config: a different AckWait, or a MaxAckPending below the
// configured one (Config.MaxAckPending, else defaultPending), is updated
// with an Info line naming the old and new values; a MaxAckPending above
// the configured one is kept, with a warning, because other workers on the
// durable may count on it. With BindOnly nothing is updated: each
// difference is a warning. A failed update is a warning too, and the
// consumer is used as it is: it still delivers, only with its own settings.
func (s *Source) reconcile(ctx context.Context, cons jetstream.Consumer, defaultPending int) (jetstream.Consumer, error) {
	info := cons.CachedInfo()
	if err := s.checkExisting(info); err != nil {
		return nil, &fatalError{err}
	}
	if info == nil {
		return cons, nil
	}
	old := info.Config
	want := old
	wantPending := cmp.Or(s.cfg.MaxAckPending, defaultPending)
	switch {
	case old.MaxAckPending > 0 && old.MaxAckPending < wantPending:
		want.MaxAckPending = wantPending
	case old.MaxAckPending > wantPending || old.MaxAckPending < 0:
		s.log.Warn("the existing consumer's MaxAckPending is above the configured max_ack_pending; kept, since other workers on it may need it: lower it on the server (nats consumer edit) if it is too high",
			"max_ack_pending", old.MaxAckPending, "configured", wantPending)
	}
	if s.cfg.AckWait > 0 && old.AckWait != s.cfg.AckWait {
		want.AckWait = s.cfg.AckWait
	}
	if want.MaxAckPending == old.MaxAckPending && want.AckWait == old.AckWait {
		return cons, nil
	}
	attrs := []any{"old_ack_wait", old.AckWait, "ack_wait", want.AckWait, "old_max_ack_pending", old.MaxAckPending, "max_ack_pending", want.MaxAckPending}
	if s.cfg.BindOnly {
		s.log.Warn("the existing consumer differs from the configuration; BindOnly is set, so it is not updated", attrs...)
		return cons, nil
	}
	updated, err := s.js.UpdateConsumer(ctx, s.cfg.Stream, want)
	if err != nil {
		s.log.Warn("updating the existing consumer failed; it is used as it is", append(attrs, "err", err)...)
		return cons, nil
	}
	s.log.Info("updated the existing consumer to follow the configuration", attrs...)
	return updated, nil
}

// checkExisting refuses a consumer the Source cannot drive and warns where
// an existing consumer differs from Config in what reconcile leaves alone.
func (s *Source) checkExisting(info *jetstream.ConsumerInfo) error {
	if info == nil {
		return nil
	}
	c := info.Config
	if c.DeliverSubject != "" {
		return fmt.Errorf("dedup: nats: consumer %q of stream %q is a push consumer; a pull consumer is needed", s.cfg.Consumer, s.cfg.Stream)
	}
	if c.AckPolicy != jetstream.AckExplicitPolicy {
		return fmt.Errorf("dedup: nats: consumer %q of stream %q has ack policy %s; explicit is needed", s.cfg.Consumer, s.cfg.Stream, c.AckPolicy)
	}
	if s.cfg.Subject != "" && c.FilterSubject != s.cfg.Subject {
		s.log.Warn("the existing consumer has another filter subject; bound unchanged", "configured", s.cfg.Subject, "existing", c.FilterSubject, "existing_filters", c.FilterSubjects)
	}
	if c.MaxDeliver > 0 {
		s.log.Warn("the existing consumer has a MaxDeliver: the server stops redelivering after it, whatever the worker's max attempts", "max_deliver", c.MaxDeliver)
	}
	return nil
}

// checkDeadLetter resolves where dead letters go and refuses a dead-letter
// subject the consumer itself would read back.
func (s *Source) checkDeadLetter(ctx context.Context, info *jetstream.ConsumerInfo) error {
	if s.cfg.DeadLetterSubject == "" {
		return nil
	}
	mode, stream, err := s.resolveDeadLetter(ctx)
	if err != nil {
		return err
	}
	if mode == dlCore {
		s.log.Warn("no stream captures the dead-letter subject: dead letters go to core NATS subscribers only", "dead_letter_subject", s.cfg.DeadLetterSubject)
		return nil
	}
	if stream != s.cfg.Stream || info == nil {
		return nil
	}
	filters := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	for _, f := range filters {
		if subjectMatches(f, s.cfg.DeadLetterSubject) {
			return &fatalError{fmt.Errorf("dedup: nats: dead-letter subject %q is in stream %q and matches the filter %q of consumer %q: dead letters would be consumed again", s.cfg.DeadLetterSubject, s.cfg.Stream, f, s.cfg.Consumer)}
		}
	}
	return nil
}

// resolveDeadLetter finds (once) whether a stream captures the dead-letter
// subject.
func (s *Source) resolveDeadLetter(ctx context.Context) (dlMode, string, error) {
	s.dlMu.Lock()
	defer s.dlMu.Unlock()
	stream, err := s.js.StreamNameBySubject(ctx, s.cfg.DeadLetterSubject)
	switch {
	case err == nil:
		s.dlMode = dlStream
		return dlStream, stream, nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		s.dlMode = dlCore
		return dlCore, "", nil
	default:
		return dlUnknown, "", fmt.Errorf("dedup: nats: looking up the stream of dead-letter subject %q: %w", s.cfg.DeadLetterSubject, err)
	}
}

func (s *Source) publishDeadLetter(ctx context.Context, m *nats.Msg) error {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	s.dlMu.Lock()
	mode := s.dlMode
	s.dlMu.Unlock()
	if mode == dlUnknown {
		var err error
		if mode, _, err = s.resolveDeadLetter(ctx); err != nil {
			return err
		}
	}
	if mode == dlStream {
		_, err := s.js.PublishMsg(ctx, m)
		return err
	}
	nc := s.js.Conn()
	if err := nc.PublishMsg(m); err != nil {
		return err
	}
	return nc.FlushWithContext(ctx)
}
