// Package redisbackend is the Redis implementation of idempotency.Store
// (SPEC §4): one JSON string per effective key, every state change one Lua
// script from package lua, leases on the Redis server's clock.
//
// It runs on any redis.UniversalClient: *redis.Client (standalone, or
// Sentinel through redis.NewFailoverClient) and *redis.ClusterClient. A batch
// claim or completion is one EVALSHA on a single node; on a ClusterClient the
// batch is split by hash slot (computed here, the same CRC16 as the server)
// and sent as one EVALSHA per slot in one pipeline. Keys are never hash-tagged
// by this package, so a scope's keys spread over the whole cluster.
// *redis.Ring is refused: its sharding does not match multi-key scripts.
//
// Scripts run with EVALSHA. A single call that meets NOSCRIPT (a restart,
// failover or SCRIPT FLUSH emptied the cache) loads every script again and
// runs with EVAL; a pipeline cannot fall back per command, so the scripts are
// loaded before the first pipeline, and the commands of a pipeline that met
// NOSCRIPT — only those: the others ran — are sent again with EVAL after a
// SCRIPT LOAD on every node.
//
// go-redis retries a command after a network error, and a script may have
// run before its reply was lost. A retried claim finds its own token and is
// reported owned, not IN_FLIGHT; a retried completion finds the record
// COMPLETED and reports false, as the Store contract says (see the note on
// Complete).
//
// Wait follows SPEC §4.6: one Pub/Sub connection per Store, started by a
// Wait, resubscribed when it dies, stopped by Close or after 30s without
// waiters (every completion is published to every subscribed process, and
// waits are rare; the next Wait subscribes again), fanning the
// notifications of channel "<namespace>:dedup:done" out to the waiters of
// each key. A waiter subscribes before it reads, then sleeps until a
// notification or a backed-off re-read (PollFloor doubling to PollCap):
// Pub/Sub may drop a message, the re-read may not.
//
// Every error from Redis satisfies errors.Is(err, idempotency.ErrStoreUnavailable)
// and names the operation ("dedup: redis claim: ..."); an error caused by the
// caller's context also satisfies errors.Is(err, context.Canceled) or
// context.DeadlineExceeded. A malformed call (duplicate key in a batch, empty
// key, non-positive lease) returns ErrInvalidRequest instead, and is never
// sent.
package redisbackend
