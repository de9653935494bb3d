// Package redisbackend is the Redis implementation of idempotency.Store: one JSON string per effective key, every state change one Lua
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
// COMPLETED under its token and reports true. Both write the record back
// unchanged, so that a WAIT after them (Durability) covers the first write,
// made on another connection.
//
// # Durability
//
// Redis replicates asynchronously: the primary answers a write before any
// replica has it. If the primary dies then and Sentinel (or the Cluster)
// promotes a replica, the write is gone: a lost claim lets another worker
// run the key while the first still runs it, a lost completion lets a
// redelivery run it again. Options.Durability{Replicas: N, Timeout: T}
// closes that window. Every Claim, Complete (dead-letter
// completions included), Release and SaveStep sends WAIT N T right after
// its script, in the same pipeline, so on the same connection (WAIT waits
// for that connection's writes); on a ClusterClient the scripts are grouped
// by the primary of their slots and each group is pipelined with its WAIT
// on that primary's own client, since the ClusterClient would route a WAIT,
// which has no key, to any node. The call returns only when N replicas
// acknowledged; otherwise it fails with ErrReplicaShortfall, wrapping
// idempotency.ErrStoreUnavailable: the engine runs no handler on such a
// claim and sends no ack after such a completion, and retries with backoff. Each WAIT's time, on the server's clock, goes to
// consumer.HookStoreCall as op "wait"; each failed call to
// consumer.HookDurabilityShortfall (Options.Hooks). With Replicas 0 (the
// default) nothing is added: no WAIT, no TIME, no other pipeline.
//
// What Replicas: 1 survives: the primary dying at any moment (a kill, a
// lost host) with Sentinel promoting the replica that acknowledged (with
// one replica, the only one it can promote). No claim a handler runs under
// and no completion a broker ack followed is lost, so no key runs twice —
// provided the failover ends within the leases of the handlers running or
// finishing in it: renewals fail while it lasts, a handler that finished
// has its result held by the engine until its completion lands, and a
// lease that runs out on the new primary is reclaimed. What it does not survive, or promise:
//
//   - The primary and every replica that acknowledged dying together, or
//     such a replica restarting without its data before it is promoted: a
//     replica acknowledges what it holds in memory, not on disk.
//   - A promotion of a replica that did not acknowledge: with more replicas
//     than Replicas, Sentinel may choose another one (by replica-priority,
//     then replication offset; a replica cut off for long is passed over).
//     Set Replicas to the number of replicas to close this, at the price of
//     failing closed whenever one of them is down.
//   - WAIT is not consensus. A write whose WAIT fell short is on the
//     primary and perhaps on some replicas; the store reports it failed,
//     and it stays. A Claim that fell short therefore gives its claims back
//     (released, the attempt it counted taken back, without WAIT). A
//     Complete that fell short is retried by the engine with the same
//     token, which reports true and waits again, until the wait is met or
//     the delivery's context ends; then the message is redelivered, and its
//     claim finds the key completed.
//     So that the duplicate is acked only once the completion is on the
//     replicas, a durable claim writes a DUPLICATE's record back unchanged
//     before its WAIT: with Durability, a duplicate costs a write.
//   - Renew does not wait: a renewal lost in a failover leaves the lease
//     of the last replicated renewal, and the next renewal (every lease/3)
//     extends it again.
//   - A replica outage makes every write fail closed after Timeout: the
//     workers stop until a replica is back, by design.
//
// # Attempts and abandoned claims
//
// A record counts the claims of its key that made a new owner (attempts),
// and the engine dead-letters a key whose claim is past max_attempts. A claim nobody completes or releases (its worker was killed)
// is kept lease + max(Options.Grace, the request's Retention), and a
// renewal keeps that tail, so that a worker restarting later than lease +
// grace, as in a crash loop under Kubernetes back-off, still finds the
// claim, reclaims it with attempts + 1 and, past max_attempts, dead-letters
// the key instead of starting it again at attempt 1 (the claim's key lives
// lease + max(grace, retention), not lease + grace). The engine passes the
// handler's retention, so an abandoned claim is kept no longer than the
// key's completion would be. The common path pays nothing for it: one more
// argument per key, converted once per call, and the completion or release
// replaces the claim with its own TTL anyway.
//
// # Fences
//
// A claim that makes a new owner (NEW, RECLAIMED, RECOVERED) sets the
// record's fence to max(stored fence + 1, the server's TIME in
// microseconds), inside the claim script. What a downstream
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
// Wait keeps one Pub/Sub connection per Store, started by a
// Wait, resubscribed when it dies, stopped by Close or after 30s without
// waiters (every completion call publishes its keys, in one message, to
// every subscribed process, and waits are rare; the next Wait subscribes
// again), fanning the
// notifications of channel "<namespace>:dedup:done" out to the waiters of
// each key. A waiter subscribes before it reads, then sleeps until a
// notification or a backed-off re-read (PollFloor doubling to PollCap):
// Pub/Sub may drop a message, the re-read may not.
//
// # Local cache
//
// Options.LocalCache keeps, in process, the COMPLETED records this Store
// wrote, and answers a claim of such a key with the same fingerprint and
// version as DUPLICATE, with the stored result, without Redis. What may
// enter it: only a completion this Store made and Redis confirmed (with
// Durability, after its WAIT), never a record a claim read; a completion
// that raced an invalidation or a change of the subscription is left out.
// An entry lives at most LocalCache.TTL and never past the retention of
// its record. Delete (dedupworker forget) and ForgetIf (forget --state)
// publish an invalidation on "<namespace>:dedup:forget" — the key, or ""
// for every key after a bulk call — which each Store with a cache
// receives on a subscription of its own, held from New to Close; while it
// is not confirmed the cache is empty and answers nothing, and every
// (re)subscription starts it empty. The staleness bound: a record that
// changes with no invalidation reaching this process (deleted by hand,
// evicted, lost with a wiped or failed-over Redis, a message dropped on a
// live connection) is still answered from the cache for at most TTL after
// its completion.
//
// The same option answers for the claims this Store holds: while it holds
// a live owned claim on a key, another claim of that key (same fingerprint
// and version) is IN_FLIGHT without Redis, and a Wait on it waits in
// process for this Store's completion (then returns the cached COMPLETED
// record) or for the claim to end otherwise (then asks Redis for the rest of
// its wait). These answers follow the cache's trust (the confirmed
// subscription, invalidations, flushes) and end before the claim's lease,
// by a tenth of it (at most 1s). They can only delay a duplicate: only
// DUPLICATE acks one, and only a completion Redis confirmed is answered
// DUPLICATE. If the claim was lost without this Store knowing (a lost
// record, a reclaim after missed renewals), the local IN_FLIGHT lasts until
// this Store's lease end at most. LocalCacheStats counts the hits, the
// in-flight answers and the local waits.
//
// Every error from Redis satisfies errors.Is(err, idempotency.ErrStoreUnavailable)
// and names the operation ("dedup: redis claim: ..."); an error caused by the
// caller's context also satisfies errors.Is(err, context.Canceled) or
// context.DeadlineExceeded. A malformed call (duplicate key in a batch, empty
// key, non-positive lease) returns ErrInvalidRequest instead, and is never
// sent.
package redisbackend
