#!/usr/bin/env bash
# make demo: a fresh SQLite database, three sample jobs, one worker in burst mode; the
# shop; a schedule firing every two seconds; flow control (a limit, a snooze, a timeout);
# a worker serving its metrics; where to look.
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

echo
echo "== the shop: orders placed through the view, fulfilled by a saga"
"$PY" manage.py shop_demo seed
"$PY" manage.py shop_demo place
echo "== recover_sagas --burst (drives the fulfilment sagas started with each order)"
"$PY" manage.py recover_sagas --burst
echo "== dispatch_outbox --burst (delivers OrderPlaced to the mailer, once per message)"
"$PY" manage.py dispatch_outbox --burst
echo "== run_jobs --burst (invoices with progress, shipping labels)"
"$PY" manage.py run_jobs --burst --concurrency 2 --worker-id demo-shop-worker
echo "== the shop's final states"
"$PY" manage.py shop_demo report

echo
echo "== the shop's order workflow: reserve stock (inline step), price the lines in parallel"
echo "   (map), wait for the payment (signal), ship (child workflow)"
"$PY" manage.py shop_demo basket
echo "== run_jobs --burst: the run reserves, prices its lines on 4 threads, then waits for 'paid'"
"$PY" manage.py run_jobs --burst --concurrency 4 --worker-id demo-workflows
"$PY" manage.py shop_demo pay
echo "== run_jobs --burst: the signal wakes the run, the child ships the parcel"
"$PY" manage.py run_jobs --burst --concurrency 4 --worker-id demo-workflows
"$PY" manage.py shop_demo basket-report

echo
echo "== schedules: demo-heartbeat every 2 s, enqueued by the worker's scheduler (one job per period)"
export TIMETABLE=demo
"$PY" manage.py run_jobs --worker-id demo-scheduler &
worker=$!
"$PY" manage.py timetable_demo wait --periods 2
kill -TERM "$worker"
wait "$worker"
worker=
"$PY" manage.py list_schedules

echo
echo "== flow control: max_running=2 on every worker, a snooze, a timeout; a paused queue"
export FLOW_TASKS=1 JOBS_TIMEOUT_GRACE_SECONDS=0.2 JOBS_SCHEDULER=false
"$PY" manage.py flow_demo submit
"$PY" manage.py jobs_queues pause reports
"$PY" manage.py run_jobs --concurrency 4 --worker-id demo-flow &
worker=$!
"$PY" manage.py flow_demo wait
kill -TERM "$worker"
wait "$worker"
worker=
"$PY" manage.py jobs_queues list
unset FLOW_TASKS JOBS_TIMEOUT_GRACE_SECONDS JOBS_SCHEDULER

echo "== observability: a worker serving Prometheus metrics (--metrics-port), its row in the workers registry"
"$PY" manage.py shop_demo place
log="$dir/observed-worker.log"
"$PY" manage.py run_jobs --metrics-port 0 --worker-id demo-observed >"$log" 2>&1 &
worker=$!
"$PY" - "$log" <<'PYTHON'
import re, sys, time, urllib.request
log, deadline, url = sys.argv[1], time.monotonic() + 60, None
while time.monotonic() < deadline:  # the worker prints its address once it listens
    found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", open(log).read())
    if found:
        url = f"http://127.0.0.1:{found.group(1)}/metrics"
        break
    time.sleep(0.2)
if url is None:
    sys.exit("the worker did not start its metrics server:\n" + open(log).read())
wanted = ("ledon_jobs_finished_total", "ledon_jobs_queued", "ledon_workers", "ledon_outbox_pending",
          "ledon_scrape_duration_seconds")
while time.monotonic() < deadline:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    if 'ledon_workers{kind="worker",state="live"}' in text and "ledon_jobs_finished_total{" in text:
        break
    time.sleep(0.5)
print(f"scraped {url}:")
for line in text.splitlines():
    if line.startswith(wanted):
        print("  " + line)
PYTHON
kill -TERM "$worker"
wait "$worker"
worker=

cat <<'TEXT'

== where to look
- The dashboard: python manage.py createsuperuser, python manage.py runserver, then
  http://127.0.0.1:8000/admin/jobs/dashboard/ (queues, throughput per minute, workers,
  schedules, outbox lag, sagas needing attention; it reloads itself).
- A workflow run drawn step by step: http://127.0.0.1:8000/admin/workflows/workflowrun/
  (the basket's run: reserve, the price map with its items, the payment wait, the child).
- The workers registry: http://127.0.0.1:8000/admin/jobs/workerrecord/
- Prometheus metrics: run_jobs / dispatch_outbox / consume_events / recover_sagas
  --metrics-port N (127.0.0.1 unless --metrics-address), or route
  ledon.metrics.metrics_view (this project: /metrics, for staff who may view or a
  bearer token from LEDON_METRICS_TOKEN).
- Tracing: JOBS/OUTBOX/SAGAS = {"TRACING": True} and an OpenTelemetry SDK; see
  docs/operations.md.
TEXT
