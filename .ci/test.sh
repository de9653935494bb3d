#!/usr/bin/env bash
# The README's test command: start (as root, install) every service the tests
# use (.ci/services.sh), then run the whole suite with the race detector.
# Extra arguments go to go test (for example -run or a package list in place
# of ./...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/services.sh
if [ $# -eq 0 ]; then set -- ./...; fi
exec go test -race "$@"
