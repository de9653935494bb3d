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
// # Fences
//
// A claim that makes a new owner (NEW, RECLAIMED, RECOVERED) sets the
// record's fence to max(stored fence + 1, the server's TIME in
// microseconds), inside the claim script (SPEC §2, §11.3). What a downstream
// system that keeps the highest fence it has seen per key, and rejects
// writes with a lower one, can rely on:
//
//   - Fences of one key grow strictly with every new owner while its record
//     lives (released, expired and reclaimed, recovered from a corrupt
//     value).
//   - They keep growing after the record is lost: it expired after its
//     retention, was deleted (Delete, dedupworker forget), evicted, or Redis
//     was wiped, restarted without data, or failed over to a replica that
//     lacked it. The new fence is the server's clock, which has moved on
//     since the old one was handed out — provided the clock (after a
//     failover, the new primary's) has not gone back by more than the time
//     between the two claims. Keep the servers' clocks synchronised (NTP);
//     a clock set back by hours can hand out fences below ones already seen
//     for keys claimed in those hours.
//   - A fence is a positive integer below 2^53: exact in an int64, a
//     float64 and a JSON number. It is not a count of owners (Attempts is)
//     and not a timestamp to read: only its order means something.
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
