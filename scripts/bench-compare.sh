#!/usr/bin/env bash
# The no-op burn-down at concurrency 4 and 16 of this tree against another commit, in
# one run, interleaved: jobs/s, the workers' CPU and the statements per job of both.
#   scripts/bench-compare.sh REV [more options of python -m benchmarks, e.g. --runs 5]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: $0 REV [python -m benchmarks options]" >&2
  exit 2
fi
rev=$1
shift
exec "${VENV:-.venv}/bin/python" -m benchmarks --compare "$rev" --only burn-down "$@"
