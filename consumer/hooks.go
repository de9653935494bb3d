package consumer

import (
	"context"
	"time"
)

// Outcome is what was done with a delivery. The values are the label values
// of dedup_messages_total.
type Outcome string

// The outcomes, one per way a delivery can end.
const (
	OutcomeProcessed     Outcome = "processed"      // the handler ran and its result was stored
	OutcomeDuplicate     Outcome = "duplicate"      // a completed key: acked without running
	OutcomeReclaimed     Outcome = "reclaimed"      // processed after taking over an expired lease
	OutcomeMismatch      Outcome = "mismatch"       // the key was reused for other content
	OutcomeMissingKey    Outcome = "missing_key"    // no idempotency key
	OutcomePassthrough   Outcome = "passthrough"    // ran without deduplication (missing key, passthrough policy)
	OutcomeFailed        Outcome = "failed"         // the handler failed; the message will be retried
	OutcomeDeadLettered  Outcome = "dead_lettered"  // sent to the dead-letter destination and completed
	OutcomeLeaseLost     Outcome = "lease_lost"     // the claim was lost while running; the new owner finishes it
	OutcomeStoreBypassed Outcome = "store_bypassed" // the store was down and fail_open ran the handler anyway
	OutcomeWouldSkip     Outcome = "would_skip"     // shadow mode: would have been skipped, ran anyway
	OutcomeInFlight      Outcome = "in_flight"      // another worker holds the key: redelivered later
	OutcomeStoreError    Outcome = "store_error"    // the store was down: nothing ran, nothing acked, retried
	OutcomeCancelled     Outcome = "cancelled"      // shutdown or revocation stopped it: released, redelivered
)

// Hook is any value implementing one or more of the Hook* interfaces below.
// Hooks are called synchronously on the hot path and must be fast and safe
// for concurrent use. This is how metrics are wired (the binary adapts them to
// Prometheus) without the core importing a metrics library.
type Hook any

// HookOutcome is called once for every settled delivery.
type HookOutcome interface {
	OnOutcome(handler, transport string, o Outcome)
}

// HookHandlerDone is called after every run of a handler.
type HookHandlerDone interface {
	OnHandlerDone(handler string, took time.Duration, err error)
}

// HookInflight is called with +1 when a delivery starts processing and -1
// when it ends; a run of n deliveries (Runner.ProcessBatch) counts +n and
// -n.
type HookInflight interface {
	OnInflight(handler string, delta int)
}

// HookStoreCall is called after every call to the deduplication store. op is
// one of claim, complete, renew, release, inflight (a wait for a key in
// flight elsewhere), get, delete, step; a store may report its own parts of
// a call under other names (the Redis store: wait, the time of one WAIT for
// replicas).
type HookStoreCall interface {
	OnStoreCall(op string, took time.Duration, err error)
}

// HookDurabilityShortfall is called when a store write was acknowledged by
// fewer replicas than the store's durability setting requires;
// the keys of that write then failed as the store being unavailable. op is
// the store operation: claim, complete, release, step. node is the server
// whose replicas fell short: a Redis Cluster primary's address, "" on a
// single server.
type HookDurabilityShortfall interface {
	OnDurabilityShortfall(op, node string)
}

// HookLeaseRenewal is called after every lease renewal attempt with result
// "ok", "lost" or "error".
type HookLeaseRenewal interface {
	OnLeaseRenewal(handler, result string)
}

// HookCorruptRecord is called when a stored value was not a valid record and
// a claim replaced it.
type HookCorruptRecord interface {
	OnCorruptRecord(handler string)
}

// Hooks is a list of hooks with helpers that call every hook implementing
// the matching interface.
type Hooks []Hook

// Outcome calls every HookOutcome.
func (hs Hooks) Outcome(handler, transport string, o Outcome) {
	for _, h := range hs {
		if x, ok := h.(HookOutcome); ok {
			x.OnOutcome(handler, transport, o)
		}
	}
}

// HandlerDone calls every HookHandlerDone.
func (hs Hooks) HandlerDone(handler string, took time.Duration, err error) {
	for _, h := range hs {
		if x, ok := h.(HookHandlerDone); ok {
			x.OnHandlerDone(handler, took, err)
		}
	}
}

// Inflight calls every HookInflight.
func (hs Hooks) Inflight(handler string, delta int) {
	for _, h := range hs {
		if x, ok := h.(HookInflight); ok {
			x.OnInflight(handler, delta)
		}
	}
}

// StoreCall calls every HookStoreCall.
func (hs Hooks) StoreCall(op string, took time.Duration, err error) {
	for _, h := range hs {
		if x, ok := h.(HookStoreCall); ok {
			x.OnStoreCall(op, took, err)
		}
	}
}

// LeaseRenewal calls every HookLeaseRenewal.
func (hs Hooks) LeaseRenewal(handler, result string) {
	for _, h := range hs {
		if x, ok := h.(HookLeaseRenewal); ok {
			x.OnLeaseRenewal(handler, result)
		}
	}
}

// DurabilityShortfall calls every HookDurabilityShortfall.
func (hs Hooks) DurabilityShortfall(op, node string) {
	for _, h := range hs {
		if x, ok := h.(HookDurabilityShortfall); ok {
			x.OnDurabilityShortfall(op, node)
		}
	}
}

// CorruptRecord calls every HookCorruptRecord.
func (hs Hooks) CorruptRecord(handler string) {
	for _, h := range hs {
		if x, ok := h.(HookCorruptRecord); ok {
			x.OnCorruptRecord(handler)
		}
	}
}

// Observation collects what a processor learned about one delivery, for
// tracing: a wrapper puts one in the context with WithObservation, the
// processor fills it as it goes, and the wrapper reads it when Process
// returns. Processors must tolerate its absence (ObservationFrom returns
// nil).
type Observation struct {
	Outcome Outcome
	// KeyHash is a short hash of the effective key (never the key itself).
	KeyHash string
	// Fence and Attempt are set when the handler ran under a claim.
	Fence   int64
	Attempt int
	// Err is the handler's error, if it failed.
	Err error
}

type observationKey struct{}

// WithObservation returns a context carrying a new Observation.
func WithObservation(ctx context.Context) (context.Context, *Observation) {
	o := &Observation{}
	return context.WithValue(ctx, observationKey{}, o), o
}

// ObservationFrom returns the context's Observation, or nil.
func ObservationFrom(ctx context.Context) *Observation {
	o, _ := ctx.Value(observationKey{}).(*Observation)
	return o
}
