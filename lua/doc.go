// Package lua holds the Redis Lua scripts behind every state change of the
// deduplication store, embedded from the .lua files beside this
// file. Each exported string is a complete script body: the shared helpers of
// lib.lua followed by one script. Package redisbackend wraps each once in
// redis.NewScript and runs it with EVALSHA, reloading on NOSCRIPT.
//
// # Storage
//
// One Redis string per effective key, a JSON object:
//
//	{"v":1,"state":"CLAIMED"|"COMPLETED","fp":"…","fpv":1,"token":"…","fence":N,
//	 "claimed_at_ms":…,"lease_until_ms":…,"completed_at_ms":…,"outcome":"ok",
//	 "attempts":N,"result":"<base64>","meta":{…},"steps":{"name":"<base64>"},
//	 "released":true}
//
// A value is a record when it is a JSON object with state CLAIMED or
// COMPLETED; string token and fp; finite numeric fpv, fence, attempts,
// claimed_at_ms and lease_until_ms; and, when present and not null, numeric v and
// completed_at_ms, string outcome, boolean released, base64 result, meta an
// object of strings, steps an object of base64 strings. Anything else (not
// JSON, a JSON array or scalar, a missing or ill-typed field, a Redis value of
// another type) is not a record: absent to readers and replaced by the next
// claim. The Go decoder in redisbackend applies the same rule, so
// the two never disagree on what is a record. The v field is written as 1 and
// not interpreted.
//
// All times are milliseconds on the Redis server's clock (TIME), never the
// caller's. Leases compare lease_until_ms with TIME. The fence is an
// integer, in new records at least the server's time in microseconds (see
// Fences).
//
// # Scripts and replies
//
//   - Claim: KEYS the batch; ARGV grace_ms, then per key token, fp, fpv,
//     lease_ms, retention_ms, then optionally '1' (durable: a WAIT
//     follows, and a DUPLICATE's record is written back unchanged so that
//     it covers it); or, when all keys share fpv, lease and retention and
//     every token and fp is printable ASCII without '"' or backslash (so
//     it stands in JSON as it is), grace_ms, '=', fpv, lease_ms,
//     retention_ms, '1' or '0' (durable), then per key token, fp. Reply: an
//     array: first one string of an outcome code a key, in KEYS order (n
//     NEW from the template, N NEW, R RECLAIMED, V RECOVERED, D
//     DUPLICATE, I IN_FLIGHT, M MISMATCH); then, in KEYS order, a record
//     as JSON for every key not coded n (the claim just written for N, R
//     and V, the stored value for D, I and M); then the call's TIME in
//     microseconds. A key coded n had no value, and its claim is the
//     claim_json template of the request with fence = that time,
//     claimed_at_ms = the time in ms, lease_until_ms = claimed_at_ms +
//     lease_ms, attempts 1: the caller builds it from what it sent. TTL of a claim: lease +
//     max(grace, retention) (see Attempts).
//   - Complete: KEYS the batch; ARGV channel, then per key token, outcome,
//     result (base64 or ""), meta (JSON object or ""), retention_ms; or,
//     when all keys share outcome and retention and none has meta, channel,
//     '=', outcome, retention_ms, then per key token, result (base64 the
//     caller encoded, not checked again). Reply: one string, a code a key
//     in KEYS order, 1 (completed), 2 (already completed under this
//     token: a retry) or 0 (not owned), followed in decimal by the
//     completed_at_ms of the keys it completed (0 for none). The keys completed are published on channel
//     in one message: the key alone when there is one, else "\n" key "\n"
//     key … "\n". TTL: retention.
//   - Renew: KEYS[1]; ARGV token, lease_ms, grace_ms. Reply: the new
//     lease_until_ms, or 0 when not owned. TTL: the new lease plus what
//     the key had left beyond the old lease's end (PTTL), at least lease +
//     grace: a renewed claim keeps the tail its claim gave it.
//   - Release: KEYS[1]; ARGV token, keep_ms, channel[, undo]. Reply 1 or
//     0. The record is kept as CLAIMED with released=true and
//     lease_until_ms = now, for keep_ms, so fence, attempts and steps carry
//     over; the key is published. With undo = '1' (a claim that never ran:
//     the store failed it for want of replicas) attempts is also lowered by
//     one, so the next claim counts the same attempt again.
//   - Step: KEYS[1]; ARGV token, name, result (base64). Reply 1 or 0. TTL
//     kept.
//   - Forget: KEYS[1]; ARGV the invalidation channel. Deletes the key and
//     publishes it on the channel; reply 1 when there was a value, else 0.
//     ForgetIf (forget_if.go) publishes "" (every key of the namespace)
//     once per call that deleted any.
//
// Complete, Renew, Release and Step change nothing unless the key holds a
// CLAIMED, unreleased record with the given token.
//
// A claim that finds a live claim under its own token, and a completion
// that finds the key completed under its own token, are the same call sent
// again after its reply was lost: they report what the first did, and write
// the record back unchanged (SET … KEEPTTL), so that the connection's last
// write follows the first call's in the replication stream and a WAIT after
// it covers both.
//
// # Claim decisions
//
// For each key, in order: no value → NEW (attempts 1); not a record →
// RECOVERED (a fresh claim; fence and attempts continue from the old value
// when it still has numeric ones); same fingerprint version but another
// fingerprint → MISMATCH, whatever the state (a released or expired claim's
// steps belong to other content and must not be replayed); COMPLETED →
// DUPLICATE; released → NEW with attempts+1, steps kept; lease expired →
// RECLAIMED with attempts+1, steps kept; else IN_FLIGHT.
//
// # Attempts
//
// attempts counts the claims that made a new owner of a key, and the
// engine dead-letters a key whose claim is past max_attempts.
// The count lives in the record, so it lasts as long as the record does.
// SPEC §4.1 gives a CLAIMED key lease + grace; §11.3, which is newer and
// takes precedence, asks that the count survive a worker that dies on the
// key and comes back later than that (a crash loop under Kubernetes
// back-off, minutes apart). So a claim's key lives lease + max(grace,
// retention), retention being the handler's deduplication window, sent
// with each key: a key that kills its worker on every run is RECLAIMED
// with attempts+1 on every restart within the window, and dead-lettered
// once past max_attempts, however slowly the worker restarts. The tail
// costs nothing on the common path, where the completion (TTL retention)
// or the release replaces the claim anyway; it keeps only abandoned
// claims, and none longer than the key's completion would have been kept.
// Retention, like the lease, is converted to text once per script call
// when every key of the batch has the same; the argument itself costs a
// claim of a new key about 1.4k instructions of the Redis server (34.8k →
// 36.2k, callgrind medians of seven 20,000-key runs in 100-key batches).
//
// # Fences
//
// Every claim that makes a new owner sets the fence to max(stored fence + 1,
// TIME in microseconds), read once per script call; a key
// without a record gets TIME in microseconds. So fences grow strictly per
// key while the record lives, and keep growing after it is lost (expired,
// deleted, evicted, FLUSHALL, a failover to a replica without it), as long
// as the server's clock has not gone back by more than the time since the
// key's last claim. The stored + 1 term keeps them growing when claims of
// one key come within the same microsecond or the clock steps back a
// little. Microseconds since 1970 are about 1.8e15: below 2^53, so exact in
// Lua's double and in Go's int64 (until the year 2255). Lua's tostring and
// cjson.encode keep only 14 significant digits, so fences are written with
// string.format('%d') (int_s), and a record rewritten through cjson has its
// fence put in by encode (lib.lua), never by cjson.
//
// # Cost
//
// Per key a claim of a new key is two arguments and one SET NX PX GET of a
// template whose per-call parts (version, fence, times) are built once a
// call; its reply is the empty string and the call's TIME, not the record.
// A claim, a renewed claim and a completion without meta are written by
// string concatenation (claim_json, done_json in lib.lua) and read back by
// anchored patterns
// (parse), so the common path never runs cjson and never turns a number into
// text: numbers that repeat across a batch (now, the lease, the fingerprint
// version) are converted once per script. Any other value (steps, meta,
// released, written by an older version or by hand) takes the cjson path,
// and parse accepts nothing that decode+valid would read differently. A
// completion of a claim in template form is GET and SET, the completed
// record being the claim's text with its state changed and the completion's
// fields appended (no pattern match), and one PUBLISH per call for all its
// keys. A claim in the short form that finds a completion of its own
// fingerprint answers DUPLICATE from the record's start, without parse (a
// pattern over the whole record costs as much as a new key's claim and
// completion together): the client reads every DUPLICATE's record anyway,
// and claims a key whose record it cannot read again in the long form,
// which reads the whole record and recovers what valid refuses. The
// helpers of lib.lua that only records outside the templates and rare
// paths need (decode, valid, encode, owned, record, new_fence, …) are made
// by slow() at their first use in a call: every local function of a script
// is a closure made at each call, and one with many upvalues costs a call
// more than its body, which is also why claim.lua and complete.lua keep the
// paths of keys that have a value inline in their loops. Instructions per
// key and per call, measured with callgrind on the Redis server, are in
// docs/PERFORMANCE.md (BenchmarkRedisCPU).
package lua

import _ "embed" // the scripts

//go:embed lib.lua
var lib string

//go:embed claim.lua
var claim string

//go:embed complete.lua
var complete string

//go:embed renew.lua
var renew string

//go:embed release.lua
var release string

//go:embed step.lua
var step string

//go:embed forget.lua
var forget string

// The scripts, each a complete EVAL body (lib.lua's helpers + one script).
var (
	// Claim claims a batch of keys.
	Claim = lib + claim
	// Complete completes a batch of owned claims and publishes their keys.
	Complete = lib + complete
	// Renew extends an owned claim's lease.
	Renew = lib + renew
	// Release gives up an owned claim, keeping the record marked released.
	Release = lib + release
	// Step saves a finished step's result in an owned claim.
	Step = lib + step
	// Forget deletes a record and publishes its key on the invalidation
	// channel of the local caches.
	Forget = lib + forget
)
