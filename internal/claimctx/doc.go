// Package claimctx carries the claim a handler runs under from the
// deduplication engine (package idempotency), which puts it in the
// handler's context, to the accessors a handler calls (dedupworker.ClaimOf
// and dedupworker.Step), without the engine and the root package importing
// each other's exported names for it.
package claimctx
