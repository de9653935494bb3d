// Package actions holds the dedupworker binary's built-in handlers
// (SPEC §9.3): forward to Kafka or NATS, POST over HTTP, or exec a command.
// Each is a consumer.Handler; the key, fence and attempt come from the claim
// in the handler's context (idempotency.FromContext).
//
// The forward actions are also consumer.BatchHandlers: a run of messages is
// one produce call (Kafka) or a burst of asynchronous publishes whose
// PubAcks are awaited together (NATS), and each message's claim is found in
// consumer.MessageContext. http and exec make one call a message and are
// plain Handlers, so they run exactly as concurrently as the source's
// ordering allows: at once on NATS and across keys under Kafka key
// ordering, one after another within a Kafka partition under partition
// ordering.
package actions

import (
	"context"
	"strconv"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
)

// claimOf returns the claim a handler runs under; outside a deduplicated run
// (passthrough, fail-open) it is the zero ClaimInfo with Attempt 1.
func claimOf(ctx context.Context, handler string) idempotency.ClaimInfo {
	ci, ok := idempotency.FromContext(ctx)
	if !ok {
		ci = idempotency.ClaimInfo{Handler: handler, Attempt: 1}
	}
	return ci
}

// dedupHeaders are the headers the http action adds.
func dedupHeaders(ci idempotency.ClaimInfo) map[string]string {
	return map[string]string{
		"X-Dedup-Key":     ci.Key,
		"X-Dedup-Fence":   strconv.FormatInt(ci.Fence, 10),
		"X-Dedup-Attempt": strconv.Itoa(ci.Attempt),
		"X-Dedup-Handler": ci.Handler,
	}
}

// sourceName is the topic (Kafka) or subject (NATS) a message came from.
func sourceName(m *consumer.Message) string {
	if m.Origin.Subject != "" {
		return m.Origin.Subject
	}
	return m.Origin.Topic
}

// capped is an io.Writer that keeps the first n bytes and counts the rest.
type capped struct {
	buf     []byte
	n       int
	dropped int64
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.n - len(c.buf)
	if room > 0 {
		k := min(room, len(p))
		c.buf = append(c.buf, p[:k]...)
		c.dropped += int64(len(p) - k)
	} else {
		c.dropped += int64(len(p))
	}
	return len(p), nil
}

// Injector writes the trace context of ctx into outgoing headers (W3C
// traceparent, SPEC §8.7). A nil Injector leaves the headers as they are.
type Injector func(ctx context.Context, h consumer.Header)

func (i Injector) into(ctx context.Context, h consumer.Header) {
	if i != nil {
		i(ctx, h)
	}
}
