#!/usr/bin/env bash
# `make test-busy`: the whole test suite (scripts/run-tests.py, as `make test` runs it) with
# `stress-ng --cpu N` (N = ZKGUARD_BUSY_WORKERS, default 2) burning CPU beside it from the
# first compile to the last test. Prints the suite's wall time and exits with its status.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v stress-ng >/dev/null 2>&1 || { echo "test-busy: stress-ng not found (make deps installs it)" >&2; exit 1; }
workers="${ZKGUARD_BUSY_WORKERS:-2}"
stress-ng --cpu "$workers" --timeout 0 --quiet &
load=$!
trap 'kill "$load" 2>/dev/null || true; wait "$load" 2>/dev/null || true' EXIT
start=$(date +%s)
status=0
python3 scripts/run-tests.py "$@" || status=$?
echo "test-busy: the suite took $(( $(date +%s) - start )) s beside stress-ng --cpu $workers (exit $status)"
exit "$status"
