#!/usr/bin/env bash
# make demo: a fresh SQLite database, three sample jobs, one worker in burst mode.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
dir=$(mktemp -d /tmp/ledon-demo.XXXXXX)
export DATABASE_URL="sqlite:///$dir/demo.sqlite3"
trap 'kill "${worker:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT

echo "== migrate ($DATABASE_URL)"
"$PY" manage.py migrate --verbosity 0
echo "== submit sample jobs"
"$PY" manage.py demo submit
echo "== run_jobs --burst --concurrency 3 (until nothing is due)"
"$PY" manage.py run_jobs --burst --concurrency 3 --worker-id demo-worker &
worker=$!
"$PY" manage.py demo cancel-export
wait "$worker"
worker=
echo "== final states"
"$PY" manage.py demo report
