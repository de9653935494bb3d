package dedupworker

import "github.com/idemkit/dedupworker/consumer"

// Hooks are how metrics leave the worker: a value in [Config.Hooks] that
// implements one or more of these interfaces is called, synchronously on
// the hot path, for each event of its kind. Hooks must be fast and safe for
// concurrent use.
type (
	// Hook is a value implementing one or more of the Hook* interfaces.
	Hook = consumer.Hook
	// HookOutcome is called once for every settled delivery.
	HookOutcome = consumer.HookOutcome
	// HookHandlerDone is called after every run of a handler.
	HookHandlerDone = consumer.HookHandlerDone
	// HookInflight is called with +1 when a delivery starts processing and
	// -1 when it ends.
	HookInflight = consumer.HookInflight
	// HookStoreCall is called after every call to the store.
	HookStoreCall = consumer.HookStoreCall
	// HookLeaseRenewal is called after every lease renewal.
	HookLeaseRenewal = consumer.HookLeaseRenewal
	// HookDurabilityShortfall is called when a write reached fewer replicas
	// than the store's durability asks.
	HookDurabilityShortfall = consumer.HookDurabilityShortfall
	// HookCorruptRecord is called when a stored record cannot be read.
	HookCorruptRecord = consumer.HookCorruptRecord
	// Outcome is what was done with a delivery ([HookOutcome]); its values
	// are the consumer package's Outcome* constants.
	Outcome = consumer.Outcome
)
