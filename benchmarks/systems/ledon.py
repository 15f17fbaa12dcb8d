"""django-ledon (this repository): ``submit_job`` / ``submit_jobs`` and ``run_jobs``."""

from __future__ import annotations

from django.db import connection

from jobs import JobSubmission, submit_job, submit_jobs
from jobs.models import ClaimStart, Job, JobAttempt

from ..physical import HARNESS_MARK
from .base import QUEUE, ROOT, System, base_env, python_command

SCOPE = "bench"
#: The handler of each kind (``benchmarks.tasks``).
HANDLERS = {"noop": "bench.noop", "sleep5": "bench.sleep5", "cpu20": "bench.cpu20"}


def _submission(n: int, kind: str = "noop") -> JobSubmission:
    return JobSubmission.create(HANDLERS[kind], {"n": n}, queue=QUEUE)


class Ledon(System):
    name = "django-ledon"
    kinds = ("noop", "sleep5", "cpu20")

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
                f"TRUNCATE {JobAttempt._meta.db_table}, {Job._meta.db_table},"
                f" {ClaimStart._meta.db_table}"
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
        return python_command(
            str(ROOT / "manage.py"), "run_jobs", "--concurrency", str(concurrency), "-v", "0",
            *supervised,
        )  # fmt: skip

    def worker_env(self) -> dict[str, str]:
        return base_env(self.database_url)

    def remaining(self) -> int:
        # Polled every 50 ms during a burn-down: each count reads only the partial
        # index of its state (due jobs, running jobs), never the finished history —
        # the harness must not load the server it measures.
        table = Job._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"{HARNESS_MARK} SELECT (SELECT count(*) FROM {table} WHERE status = 'queued'"
                " AND NOT cancel_requested)"
                f" + (SELECT count(*) FROM {table} WHERE status = 'running'"
                " AND current_token IS NOT NULL)"
            )
            return int(cursor.fetchone()[0])

    def first_started_since(self, since: float) -> float | None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"{HARNESS_MARK} SELECT min(started_at) FROM {JobAttempt._meta.db_table}"
                " WHERE started_at >= to_timestamp(%s)",
                [since],
            )
            value = cursor.fetchone()[0]
        return None if value is None else value.timestamp()

    def last_finished_at(self) -> float | None:
        with connection.cursor() as cursor:
            cursor.execute(f"{HARNESS_MARK} SELECT max(finished_at) FROM {Job._meta.db_table}")
            value = cursor.fetchone()[0]
        return None if value is None else value.timestamp()
