"""django-ledon (this repository): ``submit_job`` / ``submit_jobs`` and ``run_jobs``."""

from __future__ import annotations

import sys

from django.db import connection

from jobs import JobSubmission, submit_job, submit_jobs

from .base import QUEUE, ROOT, System

SCOPE = "bench"
#: The handler of each kind (``benchmarks.tasks``).
HANDLERS = {
    "noop": "bench.noop",
    "sleep5": "bench.sleep5",
    "sleep5async": "bench.sleep5async",
    "cpu20": "bench.cpu20",
    "keyed": "bench.noop",
}

#: The limit keys the ``keyed`` kind spreads its jobs over.
KEYS = 64


def _submission(n: int, kind: str = "noop") -> JobSubmission:
    """The ``keyed`` kind: a no-op job with one of :data:`KEYS` limit keys."""
    key = f"k{n % KEYS}" if kind == "keyed" else None
    return JobSubmission.create(HANDLERS[kind], {"n": n}, queue=QUEUE, limit_key=key)


class Ledon(System):
    name = "django-ledon"
    kind_aliases: dict[str, str] = {}

    def __init__(self, database_url: str) -> None:
        super().__init__(database_url)
        self._calls = 0

    def _prefix(self) -> str:
        # Job ids are the caller's idempotency keys: every call gets fresh ones.
        self._calls += 1
        return f"c{self._calls}-"

    def install(self) -> None:
        """The tables come with ``migrate`` (run by the harness)."""

    def reset(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE jobs_jobattempt, jobs_job, jobs_ratebucket, jobs_limitcounter, jobs_lane,"
                " jobs_uniquehold, jobs_batch, jobs_sequence"
            )

    def enqueue_each(self, count: int) -> None:
        prefix = self._prefix()
        for n in range(count):
            submit_job(SCOPE, f"{prefix}{n}", _submission(n))

    def enqueue_bulk(self, count: int, kind: str = "noop") -> None:
        prefix = self._prefix()
        jobs = [(SCOPE, f"{prefix}{n}", _submission(n, kind)) for n in range(count)]
        assert all(r.created for r in submit_jobs(jobs))

    def enqueue_marked(self, marker: int) -> None:
        submit_job(SCOPE, f"probe-{marker}", _submission(marker))

    def worker_command(self, concurrency: int, processes: int | None = None) -> list[str]:
        """One ``run_jobs``; with ``processes``, a supervisor of that many."""
        supervised = [] if processes is None else ["--processes", str(processes)]
        return [
            sys.executable, str(ROOT / "manage.py"), "run_jobs", "--concurrency",
            str(concurrency), "-v", "0", *supervised,
        ]  # fmt: skip

    def worker_env(self) -> dict[str, str]:
        """Without the peer's app (benchmarks.settings): the worker loads ours alone."""
        return {**super().worker_env(), "BENCH_LEDON_WORKER": "1"}

    # Polled every 50 ms during a burn-down: each count reads only the partial index of
    # its state (due jobs, running jobs), never the finished history — the harness must
    # not load the server it measures.
    remaining_sql = (
        "SELECT (SELECT count(*) FROM jobs_job WHERE status = 'queued' AND NOT"
        " cancel_requested) + (SELECT count(*) FROM jobs_job WHERE status = 'running'"
        " AND current_token IS NOT NULL)"
    )
    first_started_sql = (
        "SELECT extract(epoch FROM min(started_at)) FROM jobs_jobattempt"
        " WHERE started_at >= to_timestamp(%s)"
    )
    last_finished_sql = "SELECT extract(epoch FROM max(finished_at)) FROM jobs_job"
