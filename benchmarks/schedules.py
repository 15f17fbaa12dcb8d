"""``python -m benchmarks.schedules``: what the schedules cost a worker.

Two measurements with a real ``run_jobs`` process of the test project on a fresh
database (SQLite file, or the PostgreSQL ``--database-url`` names):

- **Idle cost**: a worker with fifty schedules, none due (``TIMETABLE=fifty``), for
  ``--idle-seconds``; every statement any of its threads runs through Django is logged
  (``STATEMENT_LOG``, testproject/timetable/statements.py) and counted per thread,
  after a start-up allowance. The worker runs with ``JOBS["PREPARED_STATEMENTS"]``
  off, so that its claim statements go through Django's cursors and are counted too.
- **Enqueue delay**: a schedule every second (``TIMETABLE=tick``) beside the fifty,
  for ``--periods`` periods: each period job's ``created_at`` minus its period start,
  and its ``started_at`` minus its period start; p50 and p99.

Prints a Markdown table and writes the raw figures to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
START_UP_SECONDS = 5.0


def manage(
    database_url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def run_worker(database_url: str, seconds: float, env: dict[str, str]) -> str:
    worker = manage(database_url, "run_jobs", "--worker-id", "bench", env=env)
    time.sleep(seconds)  # a measurement window, not an ordering
    worker.send_signal(signal.SIGTERM)
    try:
        output, _ = worker.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        # What was measured is in the statement log and the database already.
        worker.kill()
        output, _ = worker.communicate(timeout=30)
        output += b"\n(did not stop on SIGTERM within 30 s; killed)\n"
    return output.decode()


def idle_cost(database_url: str, seconds: float, folder: Path) -> dict[str, Any]:
    log = folder / "idle.log"
    run_worker(
        database_url,
        seconds + START_UP_SECONDS,
        {"TIMETABLE": "fifty", "STATEMENT_LOG": str(log), "JOBS_PREPARED_STATEMENTS": "false"},
    )
    lines = [line.split("\t") for line in log.read_text().splitlines()]
    first = float(lines[0][0])
    window = [
        (float(t), thread) for t, thread, _sql in lines if float(t) >= first + START_UP_SECONDS
    ]
    span = (window[-1][0] - window[0][0]) if len(window) > 1 else seconds
    per_thread = Counter(thread for _t, thread in window)
    per_minute = {thread: round(count * 60 / span, 1) for thread, count in per_thread.items()}
    return {
        "seconds": round(span, 1),
        "statements_per_minute": per_minute,
        "worker_total_per_minute": round(sum(per_thread.values()) * 60 / span, 1),
        "scheduler_per_minute": per_minute.get("jobs-scheduler", 0.0),
    }


def enqueue_delay(database_url: str, periods: int) -> dict[str, Any]:
    run_worker(database_url, periods + 2, {"TIMETABLE": "tick,fifty", "TIMETABLE_EVERY": "1"})
    code = (
        "import json\n"
        "from jobs import JobScope\n"
        "rows = [(j.job_id, j.initial_not_before.isoformat(), j.created_at.isoformat(),\n"
        "         j.started_at and j.started_at.isoformat()) for j in JobScope('periodic').list()\n"
        "        if j.job_id.startswith('tick@')]\n"
        "print(json.dumps(rows))\n"
    )
    reader = manage(database_url, "shell", "-c", code)
    output, _ = reader.communicate(timeout=60)
    rows = json.loads(output.decode().strip().splitlines()[-1])

    def ms(later: str, earlier: str) -> float:
        return (
            datetime.fromisoformat(later) - datetime.fromisoformat(earlier)
        ).total_seconds() * 1000

    created = sorted(ms(c, p) for _id, p, c, _s in rows)
    started = sorted(ms(s, p) for _id, p, _c, s in rows if s)
    return {
        "periods": len(rows),
        "enqueue_ms": percentiles(created),
        "start_ms": percentiles(started),
    }


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    cuts = (
        statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    )
    return {"p50": round(cuts[49], 2), "p99": round(cuts[98], 2), "max": round(values[-1], 2)}


def measure(url: str, vendor: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    if manage(url, "migrate", "--verbosity", "0").wait() != 0:
        raise SystemExit(f"migrate failed on {vendor}")
    return {
        "database": vendor,
        "idle": idle_cost(url, args.idle_seconds, folder),
        "delay": enqueue_delay(url, args.periods),
    }


def row(result: dict[str, Any]) -> str:
    idle, delay = result["idle"], result["delay"]
    enqueued, started = delay["enqueue_ms"], delay["start_ms"]
    return (
        f"| {result['database']} | {idle['scheduler_per_minute']} | "
        f"{idle['worker_total_per_minute']} | {enqueued.get('p50')} / {enqueued.get('p99')} | "
        f"{started.get('p50')} / {started.get('p99')} | {delay['periods']} |"
    )


def main(argv: list[str] | None = None) -> None:
    from .server import scratch_database, throwaway_server

    parser = argparse.ArgumentParser(prog="python -m benchmarks.schedules", description=__doc__)
    parser.add_argument(
        "--database-url",
        help="an existing PostgreSQL server (a scratch database is created and dropped) "
        "instead of a throw-away one with fsync on",
    )
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--periods", type=int, default=120)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="ledon-bench-schedules-") as tmp:
        folder = Path(tmp)
        results.append(measure(f"sqlite:///{folder / 'bench.sqlite3'}", "sqlite", args, folder))
        server = throwaway_server() if args.database_url is None else nullcontext(args.database_url)
        with server as server_url, scratch_database(server_url, "ledon_bench_schedules") as url:
            results.append(measure(url, "postgresql", args, folder))
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "results": results}
    out = ROOT / "benchmarks" / "results" / "schedules.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        "| database | scheduler statements/min (idle, 50 schedules) | whole worker statements/min "
        "| enqueue after period start, ms p50 / p99 | start after period start, ms p50 / p99 "
        "| periods |"
    )
    print("|---|---|---|---|---|---|")
    for result in results:
        print(row(result))
    print(f"raw figures: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
