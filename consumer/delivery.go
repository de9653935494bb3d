package consumer

import (
	"context"
	"errors"
	"time"
)

// Delivery is one receipt of a Message from a transport, with the obligation
// to settle it: exactly one of Ack, Nak or (after DeadLetter) Ack ends it.
//
// A Delivery is used by one goroutine at a time, except Heartbeat, which the
// lease renewer may call while the handler runs. Implementations must be
// comparable (pointer types are): processors key per-delivery state by it.
type Delivery interface {
	// Message returns the message. It is never nil.
	Message() *Message
	// Attempt is the 1-based number of this delivery of the message: NATS
	// counts NumDelivered, Kafka counts retries in the worker.
	Attempt() int
	// Ack settles the delivery as done: the broker will not deliver it again
	// (Kafka: its offset may be committed).
	Ack(ctx context.Context) error
	// Nak settles the delivery as not done and asks for it again after delay
	// (NATS: NakWithDelay; Kafka: the partition waits and retries in place).
	Nak(ctx context.Context, delay time.Duration) error
	// Heartbeat tells the broker the message is still being worked on (NATS:
	// InProgress, which resets AckWait); a no-op where the broker has no such
	// timer.
	Heartbeat(ctx context.Context) error
	// DeadLetter publishes the message to the transport's dead-letter
	// destination with headers describing dl. It does not settle the
	// delivery. It returns ErrNoDeadLetter when no destination is configured.
	DeadLetter(ctx context.Context, dl DeadLetter) error
}

// DeadLetter describes why a message is being dead-lettered. Transports turn
// it into headers on the dead-letter message (see HeaderDeadLetter*).
type DeadLetter struct {
	// Reason is a short machine-readable cause: "handler_error",
	// "permanent_error", "max_attempts", "missing_key",
	// "fingerprint_mismatch".
	Reason string
	// Err is the error's text; may be empty.
	Err string
	// Key is the raw idempotency key, empty when it was missing.
	Key string
	// Handler is the scope (the handler's name).
	Handler string
	// Attempts is how many times the handler ran.
	Attempts int
}

// Header names that transports set on a dead-lettered message. The origin of
// the message (topic, partition, offset or stream, sequence) is added under
// HeaderDeadLetterOrigin* names.
const (
	HeaderDeadLetterReason    = "Dedup-Dlq-Reason"
	HeaderDeadLetterError     = "Dedup-Dlq-Error"
	HeaderDeadLetterKey       = "Dedup-Dlq-Key"
	HeaderDeadLetterHandler   = "Dedup-Dlq-Handler"
	HeaderDeadLetterAttempts  = "Dedup-Dlq-Attempts"
	HeaderDeadLetterTransport = "Dedup-Dlq-Transport"
	HeaderDeadLetterTopic     = "Dedup-Dlq-Topic"     // Kafka topic or JetStream stream
	HeaderDeadLetterSubject   = "Dedup-Dlq-Subject"   // NATS subject
	HeaderDeadLetterPartition = "Dedup-Dlq-Partition" // Kafka only
	HeaderDeadLetterOffset    = "Dedup-Dlq-Offset"    // Kafka offset or stream sequence
)

// Headers returns the dead-letter headers for dl and the message's origin, in
// a stable shape both transports use.
func (dl DeadLetter) Headers(o Origin) Header {
	h := Header{
		HeaderDeadLetterReason:    {dl.Reason},
		HeaderDeadLetterHandler:   {dl.Handler},
		HeaderDeadLetterAttempts:  {itoa(dl.Attempts)},
		HeaderDeadLetterTransport: {o.Transport},
		HeaderDeadLetterTopic:     {o.Topic},
		HeaderDeadLetterOffset:    {itoa64(o.Offset)},
	}
	if dl.Err != "" {
		h[HeaderDeadLetterError] = []string{truncate(dl.Err, 1024)}
	}
	if dl.Key != "" {
		h[HeaderDeadLetterKey] = []string{truncate(dl.Key, 1024)}
	}
	if o.Subject != "" {
		h[HeaderDeadLetterSubject] = []string{o.Subject}
	}
	if o.Transport == "kafka" {
		h[HeaderDeadLetterPartition] = []string{itoa(o.Partition)}
	}
	return h
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// ErrNoDeadLetter is returned by Delivery.DeadLetter when the transport has no
// dead-letter destination configured.
var ErrNoDeadLetter = errors.New("dedup: no dead-letter destination configured")
