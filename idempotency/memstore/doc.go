// Package memstore is an in-memory idempotency.Store for tests of handlers
// and of code built on the engine: a test gets the claims, duplicates,
// leases and fences of the Redis store without a Redis server, and may run
// the store on a clock it advances itself (Options.Now).
//
// It passes the same conformance suite as the Redis store
// (idempotency/storetest). It is not shared between processes and keeps
// nothing across a restart, so it deduplicates nothing in production: use
// redisbackend there. The project's own storage tests run against real Redis.
package memstore
