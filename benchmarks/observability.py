"""``python -m benchmarks.observability``: what observability (metrics, tracing, the
workers registry) costs.

On a throw-away PostgreSQL (fsync on), or the server ``--database-url`` names:

- **Scrape time at 1M rows**: 1,000,000 finished jobs, 1,000,000 sent outbox messages
  and 1,000,000 finished saga instances (one ``INSERT … SELECT generate_series`` each,
  :func:`load_history`), a few hundred queued, running and pending rows, ``ANALYZE``;
  then every database gauge is read ``--scrapes`` times, as a Prometheus scrape reads
  them (``DatabaseCollector.collect``): median and p95 milliseconds.
- **Per-job overhead of metrics + tracing**: ``--jobs`` no-op jobs run by one
  in-process worker (concurrency 1, burst), with ``JOBS/OUTBOX/SAGAS["METRICS"]`` and
  ``["TRACING"]`` both off, metrics only, tracing only, both on (OpenTelemetry's SDK
  with a batch processor and an exporter that drops spans, so that the figure is ours,
  not an exporter's); each ``--rounds`` times, in turn. Reported per variant: jobs per
  second, wall-clock microseconds per job more than with both off and the ratio of the
  times; the same for the process's CPU time (what metrics and tracing add is CPU work,
  while a job's wall-clock time is mostly its durable commits), medians of the rounds.

Prints a Markdown table and writes the raw figures to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .report import columns, table
from .server import DATABASE_URL_HELP, database, django_on
from .systems.base import ROOT

#: The statements that load history; %s is the row count. Spread over 30 days, so
#: that the last hour holds a realistic slice of it.
HISTORY = {
    "jobs_job": (
        "INSERT INTO jobs_job (scope_hash, job_id, handler, handler_version, payload_json,"
        " queue, priority, max_attempts, initial_not_before, next_run_at, status,"
        " attempt_count, current_token, cancel_requested, progress, progress_message,"
        " error, result_ref, leased_by, lease_expires_at, created_at, updated_at,"
        " started_at, finished_at, handler_unknown_since, trace_context)"
        " SELECT encode(sha256(('tenant-' || (g %% 1000))::bytea), 'hex'), 'old-' || g,"
        " 'bench.noop', 1, '{}', 'q' || (g %% 4), 0, 1, NULL,"
        " now() - g * interval '2.6 s',"
        " CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'succeeded' END, 1, NULL, false,"
        " NULL, '', '', NULL, '', NULL, now() - g * interval '2.6 s',"
        " now() - g * interval '2.6 s', now() - g * interval '2.6 s',"
        " now() - g * interval '2.6 s' + interval '50 ms', NULL, NULL"
        " FROM generate_series(1, %s) AS g"
    ),
    "outbox_outboxmessage": (
        "INSERT INTO outbox_outboxmessage (message_id, event_type, key, payload_json, headers,"
        " status, attempts, available_at, last_error, leased_by, lease_token,"
        " lease_expires_at, created_at, updated_at, sent_at, held)"
        " SELECT md5(g::text)::uuid, 'orders.placed', '', '{}', '{}', 'sent', 1,"
        " now() - g * interval '2.6 s', '', '', NULL, NULL, now() - g * interval '2.6 s',"
        " now() - g * interval '2.6 s', now() - g * interval '2.6 s', false"
        " FROM generate_series(1, %s) AS g"
    ),
    "sagas_sagainstance": (
        "INSERT INTO sagas_sagainstance (instance_id, name, idempotency_key, steps,"
        " completed_steps, compensated_steps, uncompensated_steps, data, status, failed_step,"
        " error, compensation_error, leased_by, leased_until, version, takeovers, created_at,"
        " updated_at, finished_at, request_digest)"
        " SELECT md5('saga' || g)::uuid, 'order-fulfilment', NULL, '[\"a\"]', '[\"a\"]', '[]',"
        " '[]', '{}', CASE WHEN g %% 100 = 0 THEN 'compensated' ELSE 'succeeded' END, '',"
        " '', '', '', NULL, 1, 0, now() - g * interval '2.6 s', now() - g * interval '2.6 s',"
        " now() - g * interval '2.6 s', '' FROM generate_series(1, %s) AS g"
    ),
}


def load_history(rows: int, tables: Sequence[str] = tuple(HISTORY)) -> None:
    """Bulk-load ``rows`` finished rows into each of ``tables`` (a fixture: the history
    a busy system keeps), then ANALYZE them."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(HISTORY[table], [rows])
        for table in tables:
            cursor.execute(f"ANALYZE {table}")


def live_rows(queued: int = 200) -> None:
    """What a busy system has besides history: queued, due and running jobs in four
    queues, pending outbox messages, running and failed saga instances."""
    from django.db import connection

    from jobs import JobScope, JobSubmission, execution

    JobScope("live").submit_many(
        [(f"live-{n}", JobSubmission.create("bench.noop", {}, queue=f"q{n % 4}"))
         for n in range(queued)]
    )  # fmt: skip
    execution.claim_due("bench-live", limit=queued // 10)
    with connection.cursor() as cursor:
        cursor.execute(
            HISTORY["outbox_outboxmessage"]
            .replace("'sent', 1", "'pending', 0")
            .replace("md5(g::text)", "md5('live' || g)"),
            [queued],
        )
        cursor.execute(
            HISTORY["sagas_sagainstance"]
            .replace("'succeeded' END", "'running' END")
            .replace("md5('saga' || g)", "md5('live-saga' || g)"),
            [queued // 4],
        )


def scrape_times(scrapes: int) -> dict[str, Any]:
    from ledon import prometheus

    prometheus.enable_all()
    collector = prometheus.DatabaseCollector()
    times = []
    for _ in range(scrapes):
        started = time.perf_counter()
        families = list(collector.collect())
        times.append((time.perf_counter() - started) * 1000)
    names = sorted({f.name for f in families})
    per_source: dict[str, float] = {}
    for name, source in sorted(prometheus.sources().items()):
        each = []
        for _ in range(scrapes):
            started = time.perf_counter()
            list(source())
            each.append((time.perf_counter() - started) * 1000)
        per_source[name] = round(statistics.median(each), 2)
    return {
        "scrapes": scrapes,
        "median_ms": round(statistics.median(times), 2),
        "p95_ms": round(sorted(times)[int(0.95 * (len(times) - 1))], 2),
        "median_ms_per_source": per_source,
        "families": names,
    }


class _DropSpans:
    """An exporter that drops what it gets (the SDK's work is measured, not an export)."""

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


#: The per-job variants (metrics and tracing off, one of them, both), as the table
#: names them.
VARIANTS = {
    "off": "metrics and tracing off",
    "metrics": "metrics only",
    "tracing": "tracing only",
    "both": "metrics and tracing",
}


def job_rounds(jobs: int, rounds: int) -> dict[str, Any]:
    from django.db import connection
    from django.test import override_settings
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from jobs import JobScope, JobSubmission, job_handler
    from jobs.worker import Worker

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_DropSpans()))  # type: ignore[arg-type]
    trace.set_tracer_provider(provider)

    @job_handler("bench.observed")
    def noop(ctx: Any) -> None:
        return None

    from django.conf import settings as django_settings

    def run(variant: str, n: int) -> tuple[float, float]:
        """The worker's wall-clock and CPU seconds (this process's, every thread's)."""
        flags = {
            "METRICS": variant in ("metrics", "both"),
            "TRACING": variant in ("tracing", "both"),
        }
        with override_settings(
            JOBS={**django_settings.JOBS, **flags},
            OUTBOX={**django_settings.OUTBOX, **flags},
            SAGAS={**django_settings.SAGAS, **flags, "RECOVER_IN_WORKER": False},
        ):
            JobScope("bench").submit_many(
                [(f"{variant}-{n}-{i}", JobSubmission.create("bench.observed", {}))
                 for i in range(jobs)]
            )  # fmt: skip
            started, cpu = time.perf_counter(), time.process_time()
            Worker(burst=True, listen=False, worker_id=f"bench-{variant}-{n}").run()
            elapsed = time.perf_counter() - started, time.process_time() - cpu
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM jobs_jobattempt")
            cursor.execute("DELETE FROM jobs_job WHERE scope_hash <> ''")
        return elapsed

    for variant in VARIANTS:  # warm every path up
        run(variant, -1)
    times: dict[str, list[tuple[float, float]]] = {variant: [] for variant in VARIANTS}
    for n in range(rounds):  # the variants in turn in every round
        for variant in VARIANTS:
            times[variant].append(run(variant, n))
    provider.shutdown()
    # The medians of the rounds: wall-clock and CPU seconds of each variant.
    wall = {v: statistics.median(w for w, _ in found) for v, found in times.items()}
    cpu = {v: statistics.median(c for _, c in found) for v, found in times.items()}
    result: dict[str, Any] = {"jobs": jobs, "rounds": rounds}
    for v in VARIANTS:
        result[v] = {
            "jobs_per_s": round(jobs / wall[v], 1),
            "overhead_us_per_job": round((wall[v] - wall["off"]) / jobs * 1e6, 1),
            "ratio": round(wall[v] / wall["off"], 3),
            "cpu_us_per_job": round(cpu[v] / jobs * 1e6, 1),
            "cpu_overhead_us_per_job": round((cpu[v] - cpu["off"]) / jobs * 1e6, 1),
            "cpu_ratio": round(cpu[v] / cpu["off"], 3),
        }
    return result


def render(result: dict[str, Any]) -> str:
    """The scrape and the per-job overhead as Markdown tables."""
    scrape, jobs = result["scrape"], result["jobs"]
    sources = ", ".join(f"{k} {v}" for k, v in scrape["median_ms_per_source"].items())
    scrapes = [
        ["rows of history per table", f"{result['rows']:,}"],
        ["every database gauge, ms (median / p95)", f"{scrape['median_ms']} / {scrape['p95_ms']}"],
        ["each source, ms (median)", sources],
    ]
    variants = [
        {"variant": name, **{k.replace("_", " "): n for k, n in jobs[v].items()}}
        for v, name in VARIANTS.items()
    ]
    return table(["scrape", ""], scrapes) + "\n\n" + columns(variants)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.observability", description=__doc__)
    parser.add_argument("--database-url", help=DATABASE_URL_HELP)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "observability.json"
    )
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        _, url = stack.enter_context(database(args.database_url, "ledon_bench_observability"))
        django_on(url, stack, "testproject.settings")
        overhead = job_rounds(args.jobs, args.rounds)
        started = time.perf_counter()
        load_history(args.rows)
        live_rows()
        loaded = time.perf_counter() - started
        scrape = scrape_times(args.scrapes)
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": args.rows,
        "load_seconds": round(loaded, 1),
        "scrape": scrape,
        "jobs": overhead,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    print(f"raw figures: {args.out}")


if __name__ == "__main__":
    main()
