package lua

import _ "embed" // the script

//go:embed forget_if.lua
var forgetIf string

// ForgetIf deletes a batch of keys, each only while its record is still of
// the given class and age when the script runs (dedupworker forget --state):
// KEYS the batch; ARGV class (claimed, released, completed,
// dead_lettered or all), older_ms (0: any age). Reply: per key 1 (deleted),
// 0 (no record) or 2 (kept: it changed since it was listed). It is kept in a
// file of its own, beside the scripts of doc.go, since it is no state
// change of the engine's.
var ForgetIf = lib + forgetIf
