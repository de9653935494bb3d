package consumer

import (
	"context"
	"errors"
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

// Permanent wraps err so that the message is dead-lettered without further
// attempts. Permanent(nil) is still a permanent failure.
func Permanent(err error) error { return &PermanentError{Err: err} }

// IsPermanent reports whether err is or wraps a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

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

// RetryAfter returns an error that retries the message after d. A negative d
// is treated as zero.
func RetryAfter(d time.Duration) error { return &RetryError{Delay: max(d, 0)} }

// RetryAfterErr is RetryAfter carrying the underlying cause for logs and
// dead-letter headers.
func RetryAfterErr(d time.Duration, err error) error {
	return &RetryError{Delay: max(d, 0), Err: err}
}

// RetryDelay reports the delay requested by a RetryError in err's chain.
func RetryDelay(err error) (time.Duration, bool) {
	var r *RetryError
	if errors.As(err, &r) {
		return r.Delay, true
	}
	return 0, false
}

// PanicError is the error a recovered handler panic becomes.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("dedup: handler panicked: %v", e.Value) }

// CallHandler runs h, turning a panic into a *PanicError.
func CallHandler(ctx context.Context, h Handler, m *Message) (result []byte, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: stack()}
			result = nil
		}
	}()
	return h.Handle(ctx, m)
}

func itoa(n int) string     { return strconv.Itoa(n) }
func itoa64(n int64) string { return strconv.FormatInt(n, 10) }
