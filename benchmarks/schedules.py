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
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .harness import percentile, run_processes
from .report import columns
from .server import DATABASE_URL_HELP, database
from .systems.base import ROOT

START_UP_SECONDS = 5.0


def manage(database_url: str, *args: str, env: dict[str, str] | None = None) -> str:
    """The output of ``manage.py args`` of the test project on ``database_url``; it
    must succeed."""
    env = {**os.environ, "DATABASE_URL": database_url, **(env or {})}
    argv = [sys.executable, "manage.py", *args]
    return subprocess.run(
        argv, cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


def run_worker(database_url: str, seconds: float, env: dict[str, str], folder: Path) -> None:
    """A ``run_jobs`` process for ``seconds`` (a measurement window), then stopped."""
    env = {**os.environ, "DATABASE_URL": database_url, **env}
    argv = [sys.executable, "manage.py", "run_jobs", "--worker-id", "bench"]
    with run_processes(argv, env, [folder / "worker.log"], cwd=ROOT):
        time.sleep(seconds)


def idle_cost(database_url: str, seconds: float, folder: Path) -> dict[str, Any]:
    log = folder / "idle.log"
    env = {"TIMETABLE": "fifty", "STATEMENT_LOG": str(log), "JOBS_PREPARED_STATEMENTS": "false"}
    run_worker(database_url, seconds + START_UP_SECONDS, env, folder)
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


def enqueue_delay(database_url: str, periods: int, folder: Path) -> dict[str, Any]:
    env = {"TIMETABLE": "tick,fifty", "TIMETABLE_EVERY": "1"}
    run_worker(database_url, periods + 2, env, folder)
    code = (
        "import json\n"
        "from jobs import JobScope\n"
        "rows = [(j.job_id, j.initial_not_before.isoformat(), j.created_at.isoformat(),\n"
        "         j.started_at and j.started_at.isoformat()) for j in JobScope('periodic').list()\n"
        "        if j.job_id.startswith('tick@')]\n"
        "print(json.dumps(rows))\n"
    )
    rows = json.loads(manage(database_url, "shell", "-c", code).strip().splitlines()[-1])

    def ms(later: str, earlier: str) -> float:
        return (
            datetime.fromisoformat(later) - datetime.fromisoformat(earlier)
        ).total_seconds() * 1000

    created = [ms(c, p) for _id, p, c, _s in rows]
    started = [ms(s, p) for _id, p, _c, s in rows if s]
    return {
        "periods": len(rows),
        "enqueue_ms": percentiles(created),
        "start_ms": percentiles(started),
    }


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    cuts = {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99), "max": max(values)}
    return {name: round(value, 2) for name, value in cuts.items()}


def measure(url: str, vendor: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    manage(url, "migrate", "--verbosity", "0")
    return {
        "database": vendor,
        "idle": idle_cost(url, args.idle_seconds, folder),
        "delay": enqueue_delay(url, args.periods, folder),
    }


def render(results: list[dict[str, Any]]) -> str:
    """One row per database, as Markdown."""

    def p50_p99(ms: dict[str, float]) -> str:
        return f"{ms.get('p50')} / {ms.get('p99')}"

    return columns(
        [
            {
                "database": r["database"],
                "scheduler statements/min (idle, 50 schedules)": r["idle"]["scheduler_per_minute"],
                "whole worker statements/min": r["idle"]["worker_total_per_minute"],
                "enqueue after period start, ms p50 / p99": p50_p99(r["delay"]["enqueue_ms"]),
                "start after period start, ms p50 / p99": p50_p99(r["delay"]["start_ms"]),
                "periods": r["delay"]["periods"],
            }
            for r in results
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.schedules", description=__doc__)
    parser.add_argument("--database-url", help=DATABASE_URL_HELP)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--periods", type=int, default=120)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="ledon-bench-schedules-") as tmp:
        folder = Path(tmp)
        results.append(measure(f"sqlite:///{folder / 'bench.sqlite3'}", "sqlite", args, folder))
        with database(args.database_url, "ledon_bench_schedules") as (_, url):
            results.append(measure(url, "postgresql", args, folder))
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "results": results}
    out = ROOT / "benchmarks" / "results" / "schedules.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(render(results))
    print(f"raw figures: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
