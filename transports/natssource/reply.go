package natssource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
)

// HeaderReplyTo carries a requester's reply subject through a stream.
// JetStream stores a message's subject, headers and payload but not the reply
// subject it was published with, so a request that must survive in a stream
// names its inbox in this header (Request does), and Reply answers it.
const HeaderReplyTo = "Dedup-Reply-To"

// ErrNoReplySubject is returned by Reply for a message without a
// HeaderReplyTo header.
var ErrNoReplySubject = errors.New("dedup: nats: message has no " + HeaderReplyTo + " header")

// Reply publishes data to the reply subject named in m's HeaderReplyTo header
// on core NATS and flushes the connection within ctx (or 5s when ctx has no
// deadline). It returns ErrNoReplySubject when m has none.
//
// Use it from a handler to answer the requester, and from the idempotency
// engine's OnDuplicate hook to answer a repeated request with the stored
// result, so the requester gets the same answer whichever copy it sees.
func Reply(ctx context.Context, nc *nats.Conn, m *consumer.Message, data []byte) error {
	to := m.Header.Get(HeaderReplyTo)
	if to == "" {
		return ErrNoReplySubject
	}
	if err := nc.Publish(to, data); err != nil {
		return fmt.Errorf("dedup: nats: reply to %s: %w", to, err)
	}
	ctx, cancel := withDefaultTimeout(ctx, defaultRequestTimeout)
	defer cancel()
	if err := nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("dedup: nats: reply to %s: flush: %w", to, err)
	}
	return nil
}

// Request publishes msg to its stream with a fresh inbox in the HeaderReplyTo
// header and waits within ctx for the first reply to it. The stream's
// acknowledgement is awaited first, so an error before the reply says the
// message was not stored. msg.Header is modified.
func Request(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) (*nats.Msg, error) {
	nc := js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("dedup: nats: request: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	msg.Header.Set(HeaderReplyTo, inbox)
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return nil, fmt.Errorf("dedup: nats: request: publish to %s: %w", msg.Subject, err)
	}
	reply, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("dedup: nats: request: waiting for the reply: %w", err)
	}
	return reply, nil
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
