package idempotency

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// State is the state of a stored record.
type State string

// Record states.
const (
	StateClaimed   State = "CLAIMED"
	StateCompleted State = "COMPLETED"
)

// ClaimOutcome is what a claim found and did, decided atomically by the store.
type ClaimOutcome string

// The claim outcomes.
const (
	// ClaimNew: there was no record (or a released one); the caller owns a
	// fresh claim.
	ClaimNew ClaimOutcome = "NEW"
	// ClaimReclaimed: a CLAIMED record's lease had expired; the caller owns
	// it now with a new token and a larger fence.
	ClaimReclaimed ClaimOutcome = "RECLAIMED"
	// ClaimDuplicate: the key is COMPLETED (same fingerprint, or one written
	// under another fingerprint version). Record holds the stored record.
	ClaimDuplicate ClaimOutcome = "DUPLICATE"
	// ClaimInFlight: another owner holds a live lease. Record holds it.
	ClaimInFlight ClaimOutcome = "IN_FLIGHT"
	// ClaimMismatch: the key exists with a different fingerprint of the same
	// version. Nothing was changed. Record holds it.
	ClaimMismatch ClaimOutcome = "MISMATCH"
	// ClaimRecovered: the stored value was not a valid record; it was
	// replaced by a fresh claim the caller owns.
	ClaimRecovered ClaimOutcome = "RECOVERED"
)

// Owned reports whether the outcome gives the caller a claim to run under.
func (o ClaimOutcome) Owned() bool {
	return o == ClaimNew || o == ClaimReclaimed || o == ClaimRecovered
}

// Record is the stored state of one effective key. Times are on
// the Redis server's clock.
type Record struct {
	// Key is the effective key without the store's namespace
	// ("<scope>:<key>").
	Key                string
	State              State
	Fingerprint        string
	FingerprintVersion int
	// Token is the claim token of the current (or last) owner.
	Token string
	// Fence grows with every new owner of the key, strictly, also across
	// the loss of the record: the Redis store sets it to
	// max(stored fence + 1, the server's time in microseconds), so a key
	// whose record expired, was deleted or wiped starts above every fence
	// it had, provided the server's clock (after a failover, the new
	// primary's) has not gone back by more than the time since that key's
	// last claim. It is a positive integer below 2^53. It is not a count:
	// use Attempts for that.
	Fence      int64
	ClaimedAt  time.Time
	LeaseUntil time.Time
	// Released is true for a CLAIMED record whose owner gave it up after a
	// transient failure; the next claim takes it as NEW with a larger
	// fence, keeping its Steps.
	Released    bool
	CompletedAt time.Time
	// Outcome is "ok" or "dead_lettered" once COMPLETED.
	Outcome string
	// Attempts counts the claims that ran the handler for this key.
	Attempts int
	Result   []byte
	Meta     map[string]string
	// Steps holds the stored results of finished steps.
	Steps map[string][]byte
}

// Record outcomes stored on completion.
const (
	RecordOutcomeOK           = "ok"
	RecordOutcomeDeadLettered = "dead_lettered"
)

// ClaimRequest asks to claim one effective key.
type ClaimRequest struct {
	// Key is the effective key without namespace ("<scope>:<key>"), see
	// EffectiveKey.
	Key                string
	Fingerprint        string
	FingerprintVersion int
	// Lease is how long the claim is owned before another worker may reclaim
	// it, measured on the store's clock.
	Lease time.Duration
	// Retention is how long the claim's record is kept after its lease
	// runs out when nobody completes or releases it (its worker died): a
	// claim of the key within that time is RECLAIMED with the attempt
	// counted, so a key that kills its worker on every run reaches
	// max_attempts however far apart the restarts come. The
	// engine passes the handler's retention, the deduplication window, so
	// no record outlives the window it belongs to. A store keeps an
	// expired claim at least its own grace; zero asks for no more.
	Retention time.Duration
}

// Claim is an owned claim: the proof of ownership every later write presents.
type Claim struct {
	Key        string
	Token      string
	Fence      int64
	LeaseUntil time.Time
	// Attempts counts claims of this key including this one.
	Attempts int
	// Steps are the results of steps finished by earlier owners.
	Steps map[string][]byte
}

// ClaimResult is the store's answer for one ClaimRequest.
type ClaimResult struct {
	Outcome ClaimOutcome
	// Claim is set when Outcome.Owned().
	Claim *Claim
	// Record is the existing record for DUPLICATE, IN_FLIGHT and MISMATCH.
	Record *Record
}

// Completion stores the result of an owned claim.
type Completion struct {
	Key   string
	Token string
	// Outcome is RecordOutcomeOK or RecordOutcomeDeadLettered.
	Outcome string
	Result  []byte
	Meta    map[string]string
	// Retention is how long the COMPLETED record is kept: the
	// deduplication window.
	Retention time.Duration
}

// Store is the deduplication state. Implementations must make every state
// change atomic and fence writes by the claim token: Complete, Renew, Release
// and SaveStep change nothing and report false when the record is gone,
// completed, or owned by another token. Leases are measured on the store's
// clock.
//
// Every method returns an error wrapping ErrStoreUnavailable when the store
// cannot be reached, so callers fail closed.
//
// # Per-key results of a batch
//
// Claim and Complete take a batch whose keys a store may send to several
// servers (a Redis Cluster sends each key to the primary of its hash slot).
// When some of those servers answer and others fail, the call reports each
// key's own result: it returns a full-length result slice and a
// [*BatchError] whose Errs holds, at each index, nil for a key whose result
// is valid and that key's error (wrapping [ErrStoreUnavailable]) otherwise.
// Read it with errors.As, or per key with [KeyError]. Any other non-nil
// error fails the whole batch, and no result is valid. A store that sends a
// batch to one server (a single Redis, a Sentinel-managed primary, memstore)
// keeps one outcome for the call: all keys succeed or the call fails.
//
// A BatchError satisfies errors.Is(err, ErrStoreUnavailable), so a caller
// that does not look at the keys fails the whole batch closed, which is safe:
// an owned claim nobody runs is reclaimed when its lease ends, and a
// completion that was stored is reported true again when it is sent again.
// A per-key error that comes from one server of several is a [*NodeError]
// naming it.
//
// A store whose batches span servers that fail independently may implement
// [NodeRouter], so that its callers can send each server's keys apart and a
// server that hangs holds back only its own keys.
type Store interface {
	// Claim claims a batch of keys in as few round trips as the deployment
	// allows. The results are in request order. A key may appear only once
	// per batch. A key whose server failed is reported in a [*BatchError].
	Claim(ctx context.Context, reqs []ClaimRequest) ([]ClaimResult, error)
	// Complete stores results of owned claims, in one round trip where
	// possible; ok[i] reports whether completion i was still owned. A
	// Complete repeated by the token that completed the key reports true
	// and changes nothing, so a retry after a lost reply is safe. A
	// completion whose server failed is reported in a [*BatchError].
	Complete(ctx context.Context, cs []Completion) (ok []bool, err error)
	// Renew extends an owned claim's lease to lease from now and returns the
	// new lease end; ok is false when the claim is no longer owned.
	Renew(ctx context.Context, key, token string, lease time.Duration) (leaseUntil time.Time, ok bool, err error)
	// Release gives up an owned claim so the key can be claimed again at
	// once. The record is kept, marked released, for keep (at least the
	// store's grace), so that its fence, attempt count and steps carry over
	// to the next claim: attempts are counted per key in the record, which is
	// how max_attempts holds across workers and transports.
	Release(ctx context.Context, key, token string, keep time.Duration) (ok bool, err error)
	// SaveStep stores the result of a finished step in an owned claim.
	SaveStep(ctx context.Context, key, token, step string, result []byte) (ok bool, err error)
	// Wait waits up to max for an IN_FLIGHT key to settle. It returns the
	// record when it is COMPLETED, nil when it was released or is gone (claim
	// again), or the still-CLAIMED record when max passed.
	Wait(ctx context.Context, key string, max time.Duration) (*Record, error)
	// Get returns the record, or nil when there is none or the stored value
	// is not a valid record.
	Get(ctx context.Context, key string) (*Record, error)
	// Delete removes the record, forcing the next delivery to run again.
	Delete(ctx context.Context, key string) (existed bool, err error)
	// Ping reports whether the store answers.
	Ping(ctx context.Context) error
}

// ErrStoreUnavailable wraps every error caused by the store not answering or
// failing a call. Use errors.Is(err, ErrStoreUnavailable).
var ErrStoreUnavailable = errors.New("dedup: store unavailable")

// BatchError is the error of a batch call ([Store].Claim, [Store].Complete)
// that failed for some of its keys only. Errs has one entry per request, in
// request order: nil where the key's result in the returned slice is valid,
// else the key's error, which wraps [ErrStoreUnavailable] when the store
// could not carry it out. A BatchError has at least one non-nil entry.
type BatchError struct {
	Errs []error
}

// Error summarises the failed keys and the first distinct errors.
func (e *BatchError) Error() string {
	errs := e.Unwrap()
	n := 0
	for _, err := range e.Errs {
		if err != nil {
			n++
		}
	}
	msg := fmt.Sprintf("dedup: %d of %d keys of the batch failed", n, len(e.Errs))
	for i, err := range errs {
		if i == 3 {
			msg += fmt.Sprintf("; and %d more errors", len(errs)-i)
			break
		}
		msg += "; " + err.Error()
	}
	return msg
}

// Unwrap returns the distinct errors of the failed keys, for errors.Is and
// errors.As: a BatchError of store failures is an [ErrStoreUnavailable].
func (e *BatchError) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil && !seen(out, err) {
			out = append(out, err)
		}
	}
	return out
}

// seen reports whether err, when comparable, is in errs.
func seen(errs []error, err error) bool {
	if !reflect.TypeOf(err).Comparable() {
		return false
	}
	return slices.Contains(errs, err)
}

// KeyError returns the error of key i of a batch call that returned err: nil
// when err is nil, [BatchError].Errs[i] when err is a [*BatchError] of n
// keys, and err itself otherwise (the whole batch failed).
func KeyError(err error, i, n int) error {
	if err == nil {
		return nil
	}
	var be *BatchError
	if errors.As(err, &be) && len(be.Errs) == n {
		return be.Errs[i]
	}
	return err
}

// NodeError is a store error that one server of several caused: Node is its
// address as the store knows it (a Redis Cluster primary's host:port).
// Metrics and logs name the server by it; the set of values is bounded by
// the servers of the deployment.
type NodeError struct {
	Node string
	Err  error
}

// Error is the error's text, naming the node unless it does already.
func (e *NodeError) Error() string {
	msg := e.Err.Error()
	if e.Node == "" || strings.Contains(msg, e.Node) {
		return msg
	}
	return "node " + e.Node + ": " + msg
}

// Unwrap returns the error the server caused.
func (e *NodeError) Unwrap() error { return e.Err }

// NodeRouter is implemented by a [Store] whose batch calls go to several
// servers that fail independently (the Redis store on a Cluster). Node
// returns the server that a call naming key goes to now, and "" when the
// store does not know or has one server; it answers from what the store
// has cached, within ctx. A batch of keys with one Node goes to one server in
// one round trip, so callers batch per node: a server that hangs until the
// call's deadline then delays only its own keys. The answer is a hint for
// grouping: the store routes every call itself, and stays correct when a
// slot moves between Node and the call.
type NodeRouter interface {
	// MultiNode reports whether the store's batches may span servers; a
	// store on one server reports false, and its callers batch as for any
	// other Store.
	MultiNode() bool
	Node(ctx context.Context, key string) string
}

// ErrLeaseLost is the cause of a handler context cancelled because its claim
// was lost: another worker reclaimed it, or renewals failed until the lease
// ran out. Check with errors.Is(context.Cause(ctx), ErrLeaseLost).
var ErrLeaseLost = errors.New("dedup: lease lost")
