package actions

import (
	"context"
	"io"
	"slices"
	"strconv"

	"github.com/idemkit/dedupworker"

	"github.com/idemkit/dedupworker/consumer"
)

// claimOf returns the claim a handler runs under; outside a deduplicated run
// (passthrough, fail-open) it is the zero Claim with Attempt 1.
func claimOf(ctx context.Context, handler string) dedupworker.Claim {
	ci, ok := dedupworker.ClaimOf(ctx)
	if !ok {
		ci = dedupworker.Claim{Handler: handler, Attempt: 1}
	}
	return ci
}

// dedupHeaders are the headers the http action adds.
func dedupHeaders(ci dedupworker.Claim) map[string]string {
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

// ReadFrom reads r to its end into c as Write would take it: the first n
// bytes kept, the rest counted. io.Copy uses it instead of making a 32 KiB
// buffer for each copy, which for the http action's response bodies, one a
// message, was most of the action's allocated bytes.
func (c *capped) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	var spill []byte // where bytes past n are read, made only when there are some
	for {
		room := c.n - len(c.buf)
		p := spill
		if room > 0 {
			if len(c.buf) == cap(c.buf) {
				c.buf = slices.Grow(c.buf, min(room, max(512, len(c.buf))))
			}
			p = c.buf[len(c.buf):min(cap(c.buf), c.n)]
		} else if spill == nil {
			spill = make([]byte, 4096)
			p = spill
		}
		k, err := r.Read(p)
		total += int64(k)
		if room > 0 {
			c.buf = c.buf[:len(c.buf)+k]
		} else {
			c.dropped += int64(k)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// Injector writes the trace context of ctx into outgoing headers (W3C
// traceparent). A nil Injector leaves the headers as they are.
type Injector func(ctx context.Context, h consumer.Header)

func (i Injector) into(ctx context.Context, h consumer.Header) {
	if i != nil {
		i(ctx, h)
	}
}
