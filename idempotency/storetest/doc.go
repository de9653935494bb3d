// Package storetest is the conformance suite every idempotency.Store must
// pass, in the manner of watermill's TestPubSub and river's
// riverdrivertest: a store's own tests call Run (store-neutral checks) or
// RunHarness (all checks, with hooks that reach past the Store interface to
// corrupt values, flush scripts and read TTLs).
//
//	func TestStore(t *testing.T) {
//		storetest.RunHarness(t, func(t *testing.T) *storetest.Harness {
//			s := newStoreWithUniqueNamespace(t)
//			return &storetest.Harness{Store: s, Grace: time.Minute, ...}
//		})
//	}
//
// Every check runs in parallel with the others, so the constructor must
// isolate them (a fresh namespace per call is enough) and close what it makes
// with t.Cleanup. Checks whose hook is nil are not run, and say so in the log.
// Leases of a few hundred milliseconds let claims expire during the run; the
// whole suite takes a few seconds.
package storetest
