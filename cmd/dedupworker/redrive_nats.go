package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/app"
	"github.com/idemkit/dedupworker/internal/config"
)

// natsDLQ reads the dead letters of a NATS handler from the stream that
// captures its dead-letter subject, and publishes them back to their
// original subjects.
type natsDLQ struct {
	nc        *nats.Conn
	js        jetstream.JetStream
	cons      jetstream.Consumer
	field     string // handlers[i].dead_letter.nats.subject, for errors
	subject   string // the dead-letter subject
	stream    string // the stream capturing it
	durable   string // the redrive durable ("" in a dry run)
	lastSeq   uint64 // the stream's last sequence when the run started
	dryRun    bool
	buf       []jetstream.Msg
	done      bool
	heldNotes []string
}

// openNATSDLQ connects to the NATS server of handler h (handlers[idx]) and
// binds to the stream of its dead-letter subject: through the redrive
// durable, or in a dry run through an ordered consumer that acks nothing.
func openNATSDLQ(ctx context.Context, idx int, h *config.Handler, dryRun bool) (*natsDLQ, error) {
	n := h.Source.NATS
	s := &natsDLQ{
		field:   fmt.Sprintf("handlers[%d].dead_letter.nats.subject", idx),
		subject: h.DeadLetter.NATS.Subject,
		dryRun:  dryRun,
	}
	cctx, cancel := context.WithTimeout(ctx, redriveCallTimeout)
	defer cancel()
	// Dead letters are published on the source's connection (config
	// validation refuses another url or credentials for them), so they
	// are read and republished on it too.
	nc, err := app.DialNATS(cctx, fmt.Sprintf("handlers[%d].source.nats", idx), n.URL, n.NATSAuth)
	if err != nil {
		return nil, err
	}
	s.nc = nc
	if s.js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, err
	}
	if err := s.bind(cctx, n.Consumer+"-redrive"); err != nil {
		nc.Close()
		return nil, err
	}
	return s, nil
}

// bind finds the stream of the dead-letter subject and the consumer to
// read it through.
func (s *natsDLQ) bind(ctx context.Context, durable string) error {
	stream, err := s.js.StreamNameBySubject(ctx, s.subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%s %q: no JetStream stream captures it, so its dead letters went to core NATS subscribers only and none is kept to redrive; add the subject to a stream (nats stream add DLQ --subjects %s) for the next ones", s.field, s.subject, s.subject)
	}
	if err != nil {
		return fmt.Errorf("%s %q: looking up the stream that captures it: %w", s.field, s.subject, err)
	}
	s.stream = stream
	st, err := s.js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %q (of %s): %w", stream, s.field, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %q (of %s): %w", stream, s.field, err)
	}
	s.lastSeq = info.State.LastSeq
	if s.dryRun {
		// The durable's unacked dead letters start after its ack floor;
		// an ordered consumer reads them from there and acks nothing.
		start := uint64(1)
		if ci, err := st.Consumer(ctx, durable); err == nil {
			start = ci.CachedInfo().AckFloor.Stream + 1
		} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("stream %q: reading consumer %q: %w", stream, durable, err)
		}
		s.cons, err = st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{s.subject},
			DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:    start,
		})
		if err != nil {
			return fmt.Errorf("stream %q: reading %q: %w", stream, s.subject, err)
		}
		return nil
	}
	s.durable = durable
	s.cons, err = st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       durable,
		Description:   "dedupworker redrive: the dead letters of " + s.subject,
		FilterSubject: s.subject,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       redriveAckWait,
		MaxAckPending: redriveFetch,
	})
	if err != nil {
		return fmt.Errorf("stream %q: creating the redrive consumer %q (filter %q): %w", stream, durable, s.subject, err)
	}
	return nil
}

func (s *natsDLQ) describe() (string, string) {
	from := fmt.Sprintf("stream %s subject %s", s.stream, s.subject)
	if s.durable != "" {
		from += " (consumer " + s.durable + ")"
	}
	return from, "the subjects they came from"
}

func (s *natsDLQ) next(ctx context.Context) (*deadLetter, error) {
	for len(s.buf) == 0 {
		if s.done {
			return nil, nil
		}
		if err := s.fill(ctx); err != nil {
			return nil, err
		}
	}
	m := s.buf[0]
	s.buf = s.buf[1:]
	md, err := m.Metadata()
	if err != nil {
		return nil, fmt.Errorf("stream %q: a message on %q without JetStream metadata: %w", s.stream, s.subject, err)
	}
	if md.Sequence.Stream > s.lastSeq {
		// Dead-lettered after the run started: the next run's.
		s.leave(ctx, &deadLetter{handle: m})
		s.done = true
		return s.next(ctx)
	}
	h := consumer.Header(m.Headers())
	dl := &deadLetter{
		ID:      fmt.Sprintf("stream %s seq %d", s.stream, md.Sequence.Stream),
		Key:     h.Get(consumer.HeaderDeadLetterKey),
		Reason:  h.Get(consumer.HeaderDeadLetterReason),
		Handler: h.Get(consumer.HeaderDeadLetterHandler),
		Origin:  h.Get(consumer.HeaderDeadLetterSubject),
		Payload: m.Data(),
		Header:  stripDLQHeaders(h),
		handle:  m,
	}
	return dl, nil
}

// fill fetches the dead letters available now; none means this run has
// read them all.
func (s *natsDLQ) fill(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	batch, err := s.cons.FetchNoWait(redriveFetch)
	if err != nil {
		return fmt.Errorf("stream %q: fetching from %q: %w", s.stream, s.subject, err)
	}
	for m := range batch.Messages() {
		s.buf = append(s.buf, m)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		return fmt.Errorf("stream %q: fetching from %q: %w", s.stream, s.subject, err)
	}
	if len(s.buf) == 0 {
		s.done = true
		s.noteHeld(ctx)
	}
	return nil
}

// noteHeld says when dead letters are delivered to an earlier run that
// stopped without acking them: they come back after the ack wait.
func (s *natsDLQ) noteHeld(ctx context.Context) {
	if s.durable == "" {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, redriveCallTimeout)
	defer cancel()
	ci, err := s.cons.Info(cctx)
	if err != nil || ci.NumAckPending == 0 {
		return
	}
	s.heldNotes = append(s.heldNotes, fmt.Sprintf("consumer %q: %d dead letter(s) went to an earlier redrive run that did not ack them; they are delivered again %s after that run read them: run redrive again then",
		s.durable, ci.NumAckPending, redriveAckWait))
}

func (s *natsDLQ) republish(ctx context.Context, dl *deadLetter) error {
	if dl.Origin == "" {
		return fmt.Errorf("the dead letter has no %s header: its original subject is unknown", consumer.HeaderDeadLetterSubject)
	}
	cctx, cancel := context.WithTimeout(ctx, redriveCallTimeout)
	defer cancel()
	ack, err := s.js.PublishMsg(cctx, &nats.Msg{Subject: dl.Origin, Data: dl.Payload, Header: nats.Header(dl.Header)})
	if err != nil {
		return fmt.Errorf("publishing to %q: %w", dl.Origin, err)
	}
	if ack.Duplicate {
		// The stream dropped it: its Nats-Msg-Id is still in the stream's
		// duplicate window, so the message is not back.
		return fmt.Errorf("stream %q dropped the message published to %q as a duplicate of its %s %q (within the stream's duplicate_window): run redrive again once that window has passed",
			ack.Stream, dl.Origin, jetstream.MsgIDHeader, dl.Header.Get(jetstream.MsgIDHeader))
	}
	return nil
}

func (s *natsDLQ) settle(ctx context.Context, dl *deadLetter) error {
	cctx, cancel := context.WithTimeout(ctx, redriveCallTimeout)
	defer cancel()
	return dl.handle.(jetstream.Msg).DoubleAck(cctx)
}

func (s *natsDLQ) leave(_ context.Context, dl *deadLetter) {
	if s.durable != "" {
		_ = dl.handle.(jetstream.Msg).Nak()
	}
}

func (s *natsDLQ) notes() []string { return s.heldNotes }

func (s *natsDLQ) close() {
	for _, m := range s.buf {
		s.leave(context.Background(), &deadLetter{handle: m})
	}
	s.buf = nil
	if s.dryRun && s.cons != nil {
		// The dry run's ordered consumer would linger until the server's
		// inactivity threshold: delete it now.
		ctx, cancel := context.WithTimeout(context.Background(), redriveCallTimeout)
		_ = s.js.DeleteConsumer(ctx, s.stream, s.cons.CachedInfo().Name)
		cancel()
	}
	// Flush sends the naks before the connection goes.
	_ = s.nc.FlushTimeout(2 * time.Second)
	s.nc.Close()
}
