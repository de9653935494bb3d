package natssource

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
)

// delivery implements consumer.Delivery for one fetched JetStream message.
// The Message is part of it: one allocation per delivery, not two.
type delivery struct {
	src     *Source
	msg     jetstream.Msg
	m       *consumer.Message // &message
	attempt int
	message consumer.Message
}

var _ consumer.Delivery = (*delivery)(nil)

func (s *Source) newDelivery(msg jetstream.Msg) *delivery {
	d := &delivery{
		src:     s,
		msg:     msg,
		attempt: 1,
		message: consumer.Message{
			Payload: msg.Data(),
			Header:  consumer.Header(msg.Headers()),
			Origin:  consumer.Origin{Transport: "nats", Topic: s.cfg.Stream, Subject: msg.Subject()},
		},
	}
	d.m = &d.message
	if len(d.m.Header) == 0 {
		d.m.Header = nil
	}
	md, err := msg.Metadata()
	if err != nil {
		s.log.Warn("message without JetStream metadata; attempt counted as 1", "stream", s.cfg.Stream, "consumer", s.cfg.Consumer, "subject", msg.Subject(), "err", err)
		return d
	}
	d.m.Origin.Offset = int64(md.Sequence.Stream)
	if md.NumDelivered > 0 {
		d.attempt = int(md.NumDelivered)
	}
	return d
}

// Message returns the message.
func (d *delivery) Message() *consumer.Message { return d.m }

// Attempt is the message's NumDelivered.
func (d *delivery) Attempt() int { return d.attempt }

// Ack acknowledges the message; with Config.AckSync it waits for the
// server's confirmation (DoubleAck) within ctx or Config.RequestTimeout.
func (d *delivery) Ack(ctx context.Context) error {
	if !d.src.cfg.AckSync {
		return d.wrap("ack", d.msg.Ack())
	}
	ctx, cancel := d.src.withTimeout(ctx)
	defer cancel()
	return d.wrap("ack", d.msg.DoubleAck(ctx))
}

// Nak asks for redelivery after delay (NakWithDelay), at once when delay is
// not positive.
func (d *delivery) Nak(_ context.Context, delay time.Duration) error {
	if delay <= 0 {
		return d.wrap("nak", d.msg.Nak())
	}
	return d.wrap("nak", d.msg.NakWithDelay(delay))
}

// Heartbeat sends InProgress, which restarts the consumer's AckWait.
func (d *delivery) Heartbeat(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.wrap("in-progress", d.msg.InProgress())
}

// DeadLetter publishes the message to Config.DeadLetterSubject with its
// headers and dl's. It does not settle the delivery.
func (d *delivery) DeadLetter(ctx context.Context, dl consumer.DeadLetter) error {
	if d.src.cfg.DeadLetterSubject == "" {
		return consumer.ErrNoDeadLetter
	}
	out := &nats.Msg{
		Subject: d.src.cfg.DeadLetterSubject,
		Data:    d.m.Payload,
		Header:  deadLetterHeader(d.m.Header, dl.Headers(d.m.Origin)),
	}
	return d.wrap("dead-letter publish", d.src.publishDeadLetter(ctx, out))
}

// deadLetterHeader merges the original headers, without the server-reserved
// "Nats-" ones except Nats-Msg-Id, with the dead-letter headers.
func deadLetterHeader(orig, dl consumer.Header) nats.Header {
	h := make(nats.Header, len(orig)+len(dl))
	for k, v := range orig {
		if strings.HasPrefix(strings.ToLower(k), "nats-") && !strings.EqualFold(k, jetstream.MsgIDHeader) {
			continue
		}
		h[k] = append([]string(nil), v...)
	}
	for k, v := range dl {
		consumer.Header(h).Del(k)
		h[k] = append([]string(nil), v...)
	}
	return h
}

func (d *delivery) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("dedup: nats: %s of %s: %w", op, d.m.Origin, err)
}
