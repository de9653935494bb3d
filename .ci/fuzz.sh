#!/usr/bin/env bash
# A short fuzzing pass over the parsers that read untrusted input: key
# extraction (payloads, headers), the YAML config, and stored records.
# Each target also runs its seed corpus under plain `go test`.
#
# The budget is a count of executions, not a duration: Go 1.26's fuzzing
# coordinator can fail a duration-bounded run with "context deadline
# exceeded" when -fuzztime ends while a worker is mid-call on a busy machine
# (golang/go#75804, fixed in Go 1.27), a failure with no input behind it.
# A count has no deadline to race. FUZZTIME overrides the budget per target
# (a count such as 50000x, or a duration).
set -euo pipefail
cd "$(dirname "$0")/.."
t="${FUZZTIME:-20000x}"
go test ./idempotency -run '^$' -fuzz '^FuzzExtractKey$' -fuzztime="$t"
go test ./internal/config -run '^$' -fuzz '^FuzzParse$' -fuzztime="$t"
go test ./redisbackend -run '^$' -fuzz '^FuzzDecodeRecord$' -fuzztime="$t"
