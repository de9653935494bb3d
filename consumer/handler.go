package consumer

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Handler does the work for one message. The returned result is stored with
// the completed record and handed to OnDuplicate hooks of later duplicates;
// it may be nil.
//
// ctx is cancelled when the worker shuts down past its drain timeout, when a
// Kafka partition is revoked, or when the deduplication lease is lost
// (context.Cause is then idempotency.ErrLeaseLost). Handlers must honour it.
type Handler interface {
	Handle(ctx context.Context, m *Message) ([]byte, error)
}

// HandlerFunc adapts an ordinary function to Handler.
type HandlerFunc func(ctx context.Context, m *Message) ([]byte, error)

// Handle calls f(ctx, m).
func (f HandlerFunc) Handle(ctx context.Context, m *Message) ([]byte, error) { return f(ctx, m) }

// PermanentError marks a handler error that retrying cannot fix. The message
// is dead-lettered at once.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "dedup: permanent error"
	}
	return "dedup: permanent: " + e.Err.Error()
}

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// RetryError asks for the message to be retried after Delay instead of the
// configured backoff. It still counts as an attempt, so max_attempts bounds it.
type RetryError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryError) Error() string {
	s := "dedup: retry after " + e.Delay.String()
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the wrapped error.
func (e *RetryError) Unwrap() error { return e.Err }

// PanicError is the error a recovered handler panic becomes.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("dedup: handler panicked: %v", e.Value) }

func itoa(n int) string     { return strconv.Itoa(n) }
func itoa64(n int64) string { return strconv.FormatInt(n, 10) }
