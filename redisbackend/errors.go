package redisbackend

import (
	"errors"

	"github.com/idemkit/dedupworker/idempotency"
)

// ErrInvalidRequest is returned, without contacting Redis, for a call the
// store cannot carry out as asked: a key twice in one batch, an empty key or
// step name, a non-positive lease or retention, an unknown outcome. It does
// not wrap idempotency.ErrStoreUnavailable: retrying will not help.
var ErrInvalidRequest = errors.New("dedup: invalid store request")

// ErrClosed is returned by every method of a Store after Close. It satisfies
// errors.Is(err, idempotency.ErrStoreUnavailable), so callers fail closed.
var ErrClosed = errors.New("dedup: redis store closed")

// opError is an error of one store operation that failed at or because of
// Redis: it names the operation and unwraps to both ErrStoreUnavailable and
// the cause.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return "dedup: redis " + e.op + ": " + e.err.Error() }

func (e *opError) Unwrap() []error { return []error{idempotency.ErrStoreUnavailable, e.err} }

// storeErr wraps a Redis error of op; nil stays nil.
func storeErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return &opError{op: op, err: err}
}
