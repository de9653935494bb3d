package natssource

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// Config configures a Source. Stream and Consumer are required; every other
// field has a default.
type Config struct {
	// Stream is the JetStream stream to consume. Required.
	Stream string
	// Consumer is the durable name of the pull consumer. Required. It is
	// created when it does not exist (unless BindOnly); when it does, its
	// AckWait and MaxAckPending are updated to follow AckWait and
	// MaxAckPending (not with BindOnly) and the rest is used as
	// it is.
	Consumer string
	// Subject is the filter subject of a consumer the Source creates; empty
	// means every subject of the stream. It is ignored (with a warning) when
	// the consumer already exists with another filter.
	Subject string
	// AckWait is the AckWait of the consumer, set when the Source creates it
	// and updated when an existing one differs: how long the
	// server waits for an ack before redelivering. Heartbeats
	// (Delivery.Heartbeat) reset it. Default 30s, the default lease. Set it
	// to the deduplication lease: the engine heartbeats on every
	// lease renewal, a third of the lease apart, and as often while a
	// duplicate waits for the key's owner, so an AckWait shorter than that
	// redelivers a message while its handler still runs or while it waits.
	AckWait time.Duration
	// MaxAckPending is the MaxAckPending of the consumer, set when the
	// Source creates it and raised when an existing one is lower (a higher
	// one is kept, with a warning: other workers may need it): how many
	// messages the server lets be unacknowledged across every worker bound
	// to the consumer. Default (0): the handler's concurrency,
	// which suits one worker; when the runner batches (a batch handler),
	// where each of the concurrency's slots is a run of up to Batch
	// messages, concurrency × Batch, at most 4096 and at least the
	// concurrency. For N workers sharing the durable consumer set N times
	// that, or they share one worker's capacity.
	MaxAckPending int
	// Batch caps how many messages go into one batch claim
	// (Runner.Prepare) and, without batching, how many the pull
	// subscription asks for ahead (its PullMaxMessages: the client holds at
	// most about twice this many not yet started). Without batching the
	// default (0) is the handler's concurrency, a value above the
	// concurrency means the concurrency, and a batch never holds more
	// messages than there are free processing slots (a slot per message).
	// When the runner batches a batch is one run, one ProcessBatch call
	// under one slot, of up to Batch messages, which may exceed the
	// concurrency; the default is the concurrency, and at least 128, since
	// every run costs work of its own (a claim call, a completion call, the
	// acks) whatever its size. The subscription then asks for 8 runs ahead
	// (8 × Batch, at most MaxAckPending), since every pull request costs
	// the server work of its own, and the client holds at most that plus
	// Batch messages not yet started.
	Batch int
	// FetchBufferBytes bounds the bytes of the messages the Source holds
	// received and not yet settled (acked or nakked): those waiting to be
	// claimed and those in handler calls, across the whole Consume. A
	// message counts its payload, its headers (as received and decoded),
	// its subject and reply subject, and about 400 bytes for the
	// structures that hold it. While the bound is full the subscription's
	// callback waits, and the library asks the server for no more
	// messages. The pull subscription's requests each ask for at most an
	// eighth of it in bytes, and never less than the largest message the
	// server can send (its max_payload and 8 KiB for the subjects), so the
	// client's pull buffer adds at most about two requests' bytes, a
	// quarter of the bound. A message larger than the whole bound is taken
	// alone, once everything taken before it is settled. Default (0):
	// DefaultFetchBufferBytes. MaxAckPending bounds the same messages in
	// number, across every worker on the consumer.
	FetchBufferBytes int
	// FetchMaxWait is how long one pull request waits on the server for
	// messages before the client renews it (its expiry); values under 1s,
	// the jetstream library's minimum, count as 1s. The server sends an
	// idle heartbeat every half of it, so a pull request lost without an
	// error (a server restart, a consumer deleted on a server that does not
	// say so) is noticed once heartbeats are missing for the expiry: the
	// request is renewed and the consumer looked up. It does not delay
	// noticing cancellation, which Consume does at once. Default 1s.
	FetchMaxWait time.Duration
	// RequestTimeout is the deadline of every JetStream API call the Source
	// makes (consumer lookup and creation, stream lookup, dead-letter
	// publish, DoubleAck) when the caller's context has none. Default 5s.
	RequestTimeout time.Duration
	// AckSync makes Ack wait for the server's confirmation (DoubleAck):
	// an ack lost in transit then fails instead of causing a redelivery.
	// 5-10× slower than a plain Ack.
	AckSync bool
	// DeadLetterSubject is where Delivery.DeadLetter publishes; empty means
	// none (DeadLetter returns consumer.ErrNoDeadLetter). It must not be
	// matched by the consumer's own filter in the same stream.
	DeadLetterSubject string
	// BindOnly makes a missing consumer an error instead of creating it, and
	// leaves an existing one unchanged (each difference from AckWait and
	// MaxAckPending is a warning).
	BindOnly bool
	// Logger receives the Source's logs; nil discards them.
	Logger *slog.Logger
}

// DefaultFetchBufferBytes is Config.FetchBufferBytes when it is 0: 32 MiB,
// the Kafka source's default too.
const DefaultFetchBufferBytes = 32 << 20

const (
	defaultAckWait        = 30 * time.Second
	defaultFetchMaxWait   = time.Second
	defaultRequestTimeout = 5 * time.Second
)

func (c *Config) withDefaults() {
	if c.AckWait == 0 {
		c.AckWait = defaultAckWait
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = defaultFetchMaxWait
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = defaultRequestTimeout
	}
	if c.FetchBufferBytes == 0 {
		c.FetchBufferBytes = DefaultFetchBufferBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// ErrInvalidConfig is wrapped by every error New returns for a bad Config:
// a *consumer.ConfigError whose Field is the Config field ("AckWait").
var ErrInvalidConfig = errors.New("dedup: nats: invalid config")

// Validate checks c as New does, with its defaults filled in: nil, or the
// first bad field's *consumer.ConfigError.
func (c Config) Validate() error {
	c.withDefaults()
	return c.validate()
}

func (c *Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return &consumer.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...), Err: ErrInvalidConfig}
	}
	switch {
	case c.Stream == "":
		return bad("Stream", "required")
	case !validName(c.Stream):
		return bad("Stream", "%q: must not contain whitespace, '.', '*', '>', '/', '\\' or '%%'", c.Stream)
	case c.Consumer == "":
		return bad("Consumer", "required (the durable consumer's name)")
	case !validName(c.Consumer):
		return bad("Consumer", "%q: must not contain whitespace, '.', '*', '>', '/', '\\' or '%%'", c.Consumer)
	case c.Subject != "" && !validSubject(c.Subject, true):
		return bad("Subject", "%q is not a valid subject filter", c.Subject)
	case c.AckWait < time.Second:
		return bad("AckWait", "%s: must be at least 1s", c.AckWait)
	case c.MaxAckPending < 0:
		return bad("MaxAckPending", "%d: must not be negative (0 means the default: the handler's concurrency, times Batch when it batches)", c.MaxAckPending)
	case c.Batch < 0:
		return bad("Batch", "%d: must not be negative", c.Batch)
	case c.FetchBufferBytes < 0:
		return bad("FetchBufferBytes", "%d: must not be negative (0 means the default, %d: 32 MiB)", c.FetchBufferBytes, DefaultFetchBufferBytes)
	case c.FetchMaxWait < 10*time.Millisecond:
		return bad("FetchMaxWait", "%s: must be at least 10ms", c.FetchMaxWait)
	case c.RequestTimeout < 0:
		return bad("RequestTimeout", "%s: must not be negative", c.RequestTimeout)
	case c.DeadLetterSubject != "" && !validSubject(c.DeadLetterSubject, false):
		return bad("DeadLetterSubject", "%q is not a valid subject (no wildcards)", c.DeadLetterSubject)
	}
	return nil
}

// validName refuses what the server refuses in stream and consumer names,
// and '%': nats-server 2.9 builds ack subjects with the name as a format
// string, so every ack of such a stream is lost and its messages redelivered
// forever.
func validName(s string) bool {
	return !strings.ContainsAny(s, " \t\r\n.*>/\\%")
}

// validSubject reports whether s is a well-formed subject; wildcards are
// allowed only when wild is set ('>' only as the last token).
func validSubject(s string, wild bool) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return false
	}
	toks := strings.Split(s, ".")
	for i, t := range toks {
		switch {
		case t == "":
			return false
		case t == "*" || t == ">":
			if !wild || (t == ">" && i != len(toks)-1) {
				return false
			}
		case strings.ContainsAny(t, "*>"):
			return false
		}
	}
	return true
}

// subjectMatches reports whether the literal subject matches filter, which
// may contain wildcards.
func subjectMatches(filter, subject string) bool {
	f := strings.Split(filter, ".")
	s := strings.Split(subject, ".")
	for i, t := range f {
		if t == ">" {
			return len(s) > i
		}
		if i >= len(s) || (t != "*" && t != s[i]) {
			return false
		}
	}
	return len(f) == len(s)
}
