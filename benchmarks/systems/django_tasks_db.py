"""django-tasks-db, the database backend of Django's tasks framework: ``enqueue`` and
``manage.py db_worker`` (one task at a time per process)."""

from __future__ import annotations

from django.db import connection, transaction

from ..physical import HARNESS_MARK
from .base import ROOT, System, WorkerConfig, base_env, python_command


class DjangoTasksDb(System):
    name = "django-tasks-db"
    package = "django-tasks-db"
    has_bulk = False

    def worker_config(self, wanted: WorkerConfig) -> WorkerConfig:
        # One task at a time per process: concurrency comes from processes only.
        return WorkerConfig(wanted.processes, 1)

    @classmethod
    def available(cls) -> bool:
        from django.conf import settings

        return bool(getattr(settings, "HAS_DJANGO_TASKS_DB", False))

    def _table(self) -> str:
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult._meta.db_table

    def install(self) -> None:
        """The table comes with ``migrate`` (run by the harness)."""

    def reset(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {self._table()}")

    def enqueue_each(self, count: int) -> None:
        from benchmarks.dtdb_tasks import noop

        for n in range(count):
            noop.enqueue(n)

    def seed(self, count: int, kind: str = "noop") -> None:
        # No bulk API: enqueue inside one transaction so that all jobs appear at once.
        from benchmarks import dtdb_tasks

        task = dtdb_tasks.sleep5 if kind == "sleep5" else dtdb_tasks.noop
        with transaction.atomic():
            for n in range(count):
                task.enqueue(n)

    def enqueue_marked(self, marker: int) -> None:
        from benchmarks.dtdb_tasks import noop

        noop.enqueue(marker)

    def worker_command(self, concurrency: int) -> list[str]:
        return python_command(str(ROOT / "manage.py"), "db_worker", "--no-startup-delay")

    def worker_env(self) -> dict[str, str]:
        return base_env(self.database_url)

    def remaining(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                f"{HARNESS_MARK} SELECT count(*) FROM {self._table()}"
                " WHERE status IN ('READY', 'RUNNING')"
            )
            return int(cursor.fetchone()[0])

    def first_started_since(self, since: float) -> float | None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"{HARNESS_MARK} SELECT min(started_at) FROM {self._table()}"
                " WHERE started_at >= to_timestamp(%s)",
                [since],
            )
            value = cursor.fetchone()[0]
        return None if value is None else value.timestamp()

    def last_finished_at(self) -> float | None:
        with connection.cursor() as cursor:
            cursor.execute(f"{HARNESS_MARK} SELECT max(finished_at) FROM {self._table()}")
            value = cursor.fetchone()[0]
        return None if value is None else value.timestamp()
