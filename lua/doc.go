// Package lua holds the Redis Lua scripts behind every state change of the
// deduplication store, embedded from the .lua files beside this file. Package
// redisbackend is their one user: it wraps each once in a script object and
// runs it with EVALSHA, loading it again on NOSCRIPT.
//
// Each exported string is a complete script body: the shared helpers of
// lib.lua followed by one script. The arguments and reply of each are
// described at the top of its .lua file. The key layout, the record's JSON,
// the claim decisions, the TTLs and the channels, which a compatible worker
// in another language must follow, are in docs/STORAGE.md.
//
// The contract every script keeps: all times are on the Redis server's clock
// (TIME), never the caller's; [Complete], [Renew], [Release] and [Step]
// change nothing unless the key holds an unreleased CLAIMED record with the
// caller's token; a value that is not a valid record is absent to every
// reader and replaced by the next [Claim]; and every claim that makes a new
// owner sets the fence to max(stored fence + 1, TIME in microseconds).
// Why the common path is written by string templates rather than cjson is
// in docs/DECISIONS.md.
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
