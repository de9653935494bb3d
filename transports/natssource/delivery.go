package natssource

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/bytebudget"
)

// delivery implements consumer.Delivery for one fetched JetStream message.
// The Message is part of it: one allocation per delivery, not two.
type delivery struct {
	src     *Source
	msg     jetstream.Msg
	m       *consumer.Message // &message
	attempt int
	message consumer.Message
	buf     *bytebudget.Budget
	cost    atomic.Int64 // what the message holds of buf until it is settled
}

var _ consumer.Delivery = (*delivery)(nil)

// initDelivery makes the zero delivery d msg's.
func (s *Source) initDelivery(d *delivery, msg jetstream.Msg) {
	*d = delivery{
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
	delivered, seq, pending, ok := ackMetadata(msg.Reply())
	if !ok {
		s.log.Warn("message without JetStream metadata; attempt counted as 1", "stream", s.cfg.Stream, "consumer", s.cfg.Consumer, "subject", msg.Subject(), "reply", msg.Reply())
		return
	}
	d.m.Origin.Offset = int64(seq)
	s.seePending(pending)
	if delivered > 0 {
		d.attempt = int(delivered)
	}
}

// ackMetadata reads a JetStream message's delivery count, stream sequence
// and the consumer's pending count from its reply (ack) subject, as
// jetstream.Msg.Metadata does but without allocating its MsgMetadata: both
// forms the server sends,
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//	$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<more>...]
//
// (9 tokens, or at least 11). A number that is not all digits reads as 0,
// as jetstream's own parser reads it. ok is false for any other subject.
func ackMetadata(reply string) (delivered, seq, pending uint64, ok bool) {
	const prefix = "$JS.ACK."
	if !strings.HasPrefix(reply, prefix) {
		return 0, 0, 0, false
	}
	tokens := strings.Count(reply, ".") + 1
	var skip int // tokens after the prefix before <delivered>
	switch {
	case tokens == 9:
		skip = 2
	case tokens >= 11:
		skip = 4
	default:
		return 0, 0, 0, false
	}
	rest := reply[len(prefix):]
	for range skip {
		_, rest, _ = strings.Cut(rest, ".")
	}
	d, rest, _ := strings.Cut(rest, ".")
	sq, rest, _ := strings.Cut(rest, ".")
	_, rest, _ = strings.Cut(rest, ".") // <cseq>
	_, rest, _ = strings.Cut(rest, ".") // <tm>
	p, _, _ := strings.Cut(rest, ".")
	return parseNum(d), parseNum(sq), parseNum(p), true
}

// parseNum is a decimal number of ASCII digits; anything else is 0.
func parseNum(s string) uint64 {
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}

// Message returns the message.
func (d *delivery) Message() *consumer.Message { return d.m }

// Attempt is the message's NumDelivered.
func (d *delivery) Attempt() int { return d.attempt }

// Ack acknowledges the message; with Config.AckSync it waits for the
// server's confirmation (DoubleAck) within ctx or Config.RequestTimeout.
func (d *delivery) Ack(ctx context.Context) error {
	defer d.settled()
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
	defer d.settled()
	if delay <= 0 {
		return d.wrap("nak", d.msg.Nak())
	}
	return d.wrap("nak", d.msg.NakWithDelay(delay))
}

// settled gives the message's cost back to the bound, once: the message is
// acked or nakked, whether or not that reached the server, and the Source
// does not need it any more.
func (d *delivery) settled() {
	if c := d.cost.Swap(0); c > 0 {
		d.buf.Release(c)
	}
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
