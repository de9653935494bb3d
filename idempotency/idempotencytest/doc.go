// Package idempotencytest has test doubles for the deduplication engine, for
// authors of handlers, stores and processors who test lease renewal and
// timing without waiting.
//
// [Clock] is a fake idempotency.Clock: time stands still until the test
// advances it, so lease renewals can be tested at their exact due time:
//
//	clock := idempotencytest.NewClock(time.Time{})
//	engine, _ := idempotency.New(store, idempotency.Config{Clock: clock})
//	// ... start a handler that blocks ...
//	clock.Advance(10 * time.Second) // the renewals due by then are sent
//
// It fakes an idempotency interface, so it sits next to that package, as
// net/http/httptest does; the in-memory Store is idempotency/memstore.
package idempotencytest
