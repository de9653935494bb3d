#!/usr/bin/env bash
# A short fuzzing pass over the parsers that read untrusted input: key
# extraction (payloads, headers), the YAML config, and stored records.
# Each target also runs its seed corpus under plain `go test`.
# FUZZTIME overrides the time per target (default 10s).
set -euo pipefail
cd "$(dirname "$0")/.."
t="${FUZZTIME:-10s}"
go test ./idempotency -run '^$' -fuzz '^FuzzExtractKey$' -fuzztime="$t"
go test ./internal/config -run '^$' -fuzz '^FuzzParse$' -fuzztime="$t"
go test ./redisbackend -run '^$' -fuzz '^FuzzDecodeRecord$' -fuzztime="$t"
