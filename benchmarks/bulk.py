"""``python -m benchmarks.bulk``: retrying a bad night's failed jobs by filter (or, with
``--runs``, resuming its failed workflow runs), and what it does to a worker's pickup
meanwhile.

On a throw-away PostgreSQL with durable commits (or ``--database-url``, a scratch
database on it):

1. ``--jobs`` failed jobs (100,000 by default: each used its one attempt, with its
   attempt row and an error) are loaded into the queue ``backlog``, and ANALYZEd;
2. one ``run_jobs`` process serves every queue at concurrency 1 (``--prefetch``: its
   ``JOBS["PREFETCH"]``, 16 by default); its idle pickup of
   jobs of the queue ``probe`` is sampled as the harness samples it
   (``benchmarks.probe``: from the commit of a probe job to its handler's first line,
   over UDP on the loopback interface), ``--samples`` times before anything else runs;
3. ``manage.py bulk_jobs retry --status failed --extra-attempts 1`` runs as a process
   of its own, while pickups go on being sampled; the samples whose job was
   committed between the command's first line and its end are "during";
4. the same number of samples once it ended (the backlog queued in ``backlog``).

With ``--runs``, the backlog is ``--jobs`` failed workflow runs instead (each with a
recorded step and a failed one, written straight into the tables), and the command
is ``manage.py bulk_workflows resume --status failed``: each run's failed step is
erased and an advance job queued for it in the queue ``default`` (the engine's
``ADVANCE_QUEUE``), the queue paused or served as ``backlog`` is above.

Two set-ups, each isolating one thing:

- by default the queue ``backlog`` is paused first, as an operator may before
  re-queueing a night's failures, and the probe jobs have a higher priority: the
  worker runs only probes, and what moves their pickup is the run's work and the
  paused backlog it leaves. The "after" samples show what that backlog alone does (a
  claim that finds fewer jobs than it asked for reads past every Queued job it cannot
  take, paused ones included); "during ÷ after" is the run's own share;
- with ``--serve-backlog`` the queue is not paused: the worker runs the re-queued jobs
  too, below the probes' priority, as it would in production once they are retried.

Prints a table and writes the raw figures to ``benchmarks/results/bulk-<time>.json``;
``docs/benchmarks.md`` holds the analysis, written by hand, with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .harness import JOB_COLUMNS, Starts, percentile, run_processes
from .report import columns
from .server import DATABASE_URL_HELP, django_on, scratch_database, server, server_settings
from .systems.base import ROOT

SCOPE = "bench"
#: Seconds between two probe jobs: the worker finishes one and falls idle.
GAP = 0.05


def load_failed(count: int) -> None:
    """``count`` failed jobs of the queue ``backlog`` (one attempt each, all used), with
    their attempt rows, written straight into the tables (a fixture), then ANALYZE."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO jobs_job ({JOB_COLUMNS})"
            " SELECT encode(sha256(('tenant-' || (g %% 100))::bytea), 'hex'), 'night-' || g,"
            " 'bench.noop', 1, '{\"n\":0}', 'backlog', 0, 1, NULL,"
            " now() - interval '6 hours', 'failed', 1, NULL, false, NULL, '',"
            " 'ConnectionError: upstream timed out after 30 s', NULL, '', NULL,"
            " now() - interval '6 hours' + g * interval '100 ms', now() - interval '5 hours',"
            " now() - interval '5 hours', now() - interval '5 hours'"
            " FROM generate_series(1, %s) AS g",
            [count],
        )
        cursor.execute(
            "INSERT INTO jobs_jobattempt (job_id, number, token, status, worker_id, progress,"
            " progress_message, error, result_ref, started_at, finished_at)"
            " SELECT id, 1, md5(id::text), 'failed', 'night-worker', NULL, '', error, NULL,"
            " started_at, finished_at FROM jobs_job WHERE status = 'failed'"
        )
        cursor.execute("ANALYZE jobs_job")
        cursor.execute("ANALYZE jobs_jobattempt")


def load_failed_runs(count: int) -> None:
    """``count`` failed workflow runs, each with a recorded step and a failed one, as a
    bad night leaves them (written straight into the tables, a fixture), then
    ANALYZE."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO workflows_workflowrun (scope_hash, run_id, name, version,"
            " input_json, output_json, status, error, failed_step, wait_kind, wait_key,"
            " wake_at, driver_token, driver_job, wake_pending, generation, advances,"
            " cancel_requested, rerun_keys, tags, parent_id, parent_key, created_at,"
            " updated_at, finished_at)"
            " SELECT encode(sha256(('tenant-' || (g %% 100))::bytea), 'hex'), 'night-' || g,"
            " 'bench.order', 1, '{\"n\":0}', NULL, 'failed',"
            " 'StepFailed: step ''charge'' failed: ConnectionError: upstream timed out',"
            " 'charge', '', '', NULL, NULL, NULL, false, 0, 2, false, '[]',"
            " jsonb_build_object('customer', (g %% 1000)::text), NULL, '',"
            " now() - interval '6 hours' + g * interval '100 ms', now() - interval '5 hours',"
            " now() - interval '5 hours'"
            " FROM generate_series(1, %s) AS g",
            [count],
        )
        for key, status, error in (
            ("reserve", "succeeded", ""),
            ("charge", "failed", "upstream timed out"),
        ):
            cursor.execute(
                "INSERT INTO workflows_workflowstep (run_id, key, kind, status, attempts,"
                " result_json, error_type, error, wake_at, item_count, child_id, started_at,"
                " finished_at)"
                " SELECT id, %s, 'step', %s, 1, 'true', '', %s, NULL, 0, NULL, created_at,"
                " finished_at FROM workflows_workflowrun",
                [key, status, error],
            )
        cursor.execute("ANALYZE workflows_workflowrun")
        cursor.execute("ANALYZE workflows_workflowstep")


class Prober:
    """Probe jobs into an idle worker, one at a time: (commit time, pickup ms) each."""

    def __init__(self, starts: Starts) -> None:
        self.starts = starts
        self.marker = 0

    def one(self) -> tuple[float, float]:
        from jobs import JobSubmission, submit_job

        self.marker += 1
        time.sleep(GAP)
        sub = JobSubmission.create("bench.noop", {"n": self.marker}, queue="probe", priority=10)
        submit_job(SCOPE, f"probe-{self.marker}", sub)
        committed = time.time()
        return committed, (self.starts.wait(self.marker, 30) - committed) * 1000

    def many(self, count: int) -> list[float]:
        return [self.one()[1] for _ in range(count)]


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "samples": len(values),
        "p50_ms": round(percentile(values, 0.50), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(max(values), 2),
    }


#: The command of each backlog, and the settings it runs under.
COMMANDS = {
    False: ["bulk_jobs", "retry", "--status", "failed", "--extra-attempts", "1"],
    True: ["bulk_workflows", "resume", "--status", "failed"],
}
SETTINGS = {False: "benchmarks.settings", True: "benchmarks.wf_settings"}


def bulk_retry(url: str, log: Path, prober: Prober, runs: bool) -> dict[str, Any]:
    """Run ``bulk_jobs retry`` (``bulk_workflows resume`` with ``runs``) in a process of
    its own; sample pickups until it ends. Its duration (process start to exit), its
    own lines' times, and the samples whose job was committed while it worked."""
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": SETTINGS[runs]}
    argv = [sys.executable, "-m", "django", *COMMANDS[runs]]
    lines: list[tuple[float, str]] = []
    spawned = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    samples: list[tuple[float, float]] = []
    while proc.poll() is None:
        samples.append(prober.one())
    ended = time.time()
    reader.join(10)
    log.write_text("\n".join(f"{t:.3f} {line}" for t, line in lines) + "\n")
    if proc.returncode != 0:
        raise RuntimeError(f"{COMMANDS[runs][0]} exited with {proc.returncode} (see {log})")
    first = lines[0][0] if lines else spawned
    during = [ms for at, ms in samples if first <= at <= ended]
    return {
        "seconds": round(ended - spawned, 2),
        "working_seconds": round(ended - first, 2),
        "batches": sum(1 for _, line in lines if line.startswith("batch ")),
        "summary": lines[-1][1] if lines else "",
        "during": summary(during),
    }


def measure(
    url: str, jobs: int, samples: int, prefetch: int, served: bool, folder: Path, runs: bool
) -> dict[str, Any]:
    from django.db import connection

    from jobs import execution

    (load_failed_runs if runs else load_failed)(jobs)
    if not served:
        execution.pause_queue("default" if runs else "backlog")
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": SETTINGS[runs],
        "BENCH_JOBS": json.dumps({"PREFETCH": prefetch}),
    }
    worker = [sys.executable, "-m", "django", "run_jobs", "--concurrency", "1", "-v", "0"]
    with Starts() as starts, run_processes(worker, {**env, **starts.env}, [folder / "w.log"]):
        prober = Prober(starts)
        prober.many(5)  # warm-up: connections, the worker's first claims
        load_before = os.getloadavg()
        before = prober.many(samples)
        run = bulk_retry(url, folder / "bulk.log", prober, runs)
        after = prober.many(samples)
        load_after = os.getloadavg()
    with connection.cursor() as cursor:
        if runs:
            # Each resumed run moved on a generation, with an advance job queued.
            cursor.execute("SELECT count(*) FROM workflows_workflowrun WHERE generation = 1")
            (requeued,) = cursor.fetchone()
            cursor.execute(
                "SELECT status, count(*) FROM jobs_job WHERE queue = 'default' GROUP BY status"
            )
        else:
            # Each retried job was granted its extra attempt; the worker may have run some.
            cursor.execute("SELECT count(*) FROM jobs_job WHERE granted_attempts = 1")
            (requeued,) = cursor.fetchone()
            cursor.execute(
                "SELECT status, count(*) FROM jobs_job WHERE queue = 'backlog' GROUP BY status"
            )
        backlog = dict(cursor.fetchall())
    during_p99 = run["during"]["p99_ms"]
    return {
        "jobs": jobs,
        "requeued": requeued,
        "backlog_at_end": backlog,
        "before": summary(before),
        "run": run,
        "after": summary(after),
        "p99_ratio": round(during_p99 / summary(before)["p99_ms"], 3),
        "p99_ratio_to_after": round(during_p99 / summary(after)["p99_ms"], 3),
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "cpus": os.cpu_count(),
        "prefetch": prefetch,
        "backlog": "served by the worker" if served else "paused",
        "what": "failed workflow runs resumed" if runs else "failed jobs retried",
    }


def render(result: dict[str, Any]) -> str:
    run = result["run"]

    what = result.get("what", "failed jobs retried")

    def cell(s: dict[str, Any]) -> str:
        return f"{s['p50_ms']} / {s['p99_ms']} ({s['samples']})"

    return columns(
        [
            {
                what: f"{result['requeued']} of {result['jobs']}",
                "command, s (target ≤ 60)": run["seconds"],
                "batches": run["batches"],
                "pickup ms p50 / p99 (samples), before": cell(result["before"]),
                "during": cell(run["during"]),
                "after": cell(result["after"]),
                "p99 during ÷ before (target ≤ 1.2)": result["p99_ratio"],
                "p99 during ÷ after": result["p99_ratio_to_after"],
            }
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bulk", description=__doc__)
    parser.add_argument("--database-url", help=DATABASE_URL_HELP)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument(
        "--serve-backlog",
        action="store_true",
        help="leave the queue backlog unpaused: the worker runs the retried jobs too "
        "(below the probes' priority)",
    )
    parser.add_argument(
        "--runs",
        action="store_true",
        help="resume failed workflow runs (bulk_workflows resume) instead of retrying jobs",
    )
    parser.add_argument(
        "--prefetch", type=int, default=16, help="the worker's JOBS['PREFETCH'] (default: 16)"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results", help="where to write"
    )
    args = parser.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with server(args.database_url) as server_url, ExitStack() as stack:
        url = stack.enter_context(scratch_database(server_url, "ledon_bench_bulk"))
        django_on(url, stack, SETTINGS[args.runs])
        folder = out / f"bulk-{stamp}"
        folder.mkdir()
        result = measure(
            url, args.jobs, args.samples, args.prefetch, args.serve_backlog, folder, args.runs
        )
        result["server"] = server_settings(url)
    result["when"] = stamp
    path = out / f"bulk-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    print(f"load average (1, 5, 15 min): before {result['load_average']['before']}, "
          f"after {result['load_average']['after']}; {result['cpus']} CPUs")  # fmt: skip
    print(f"raw figures: {path}")


if __name__ == "__main__":
    main()
