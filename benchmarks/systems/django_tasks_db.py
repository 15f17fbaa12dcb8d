"""django-tasks-db, the database backend of Django's tasks framework: ``enqueue`` and
``manage.py db_worker`` (one task at a time per process)."""

from __future__ import annotations

import sys

from django.db import connection, transaction

from .base import ROOT, System, WorkerConfig

#: Its one table (``DBTaskResult``, of the app labelled ``django_tasks_database``).
TABLE = "django_tasks_database_dbtaskresult"


class DjangoTasksDb(System):
    name = "django-tasks-db"
    package = "django-tasks-db"
    requires = ("django_tasks_db",)
    has_bulk = False

    def worker_config(self, wanted: WorkerConfig) -> WorkerConfig:
        # One task at a time per process: concurrency comes from processes only.
        return WorkerConfig(wanted.processes, 1)

    def install(self) -> None:
        """The table comes with ``migrate`` (run by the harness)."""

    def reset(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {TABLE}")

    def enqueue_each(self, count: int) -> None:
        from benchmarks.dtdb_tasks import noop

        for n in range(count):
            noop.enqueue(n)

    def seed(self, count: int, kind: str = "noop") -> None:
        # No bulk API: enqueue inside one transaction so that all jobs appear at once.
        from benchmarks import dtdb_tasks

        task = dtdb_tasks.sleep5 if kind.startswith("sleep5") else dtdb_tasks.noop
        with transaction.atomic():
            for n in range(count):
                task.enqueue(n)

    def enqueue_marked(self, marker: int) -> None:
        from benchmarks.dtdb_tasks import noop

        noop.enqueue(marker)

    def worker_command(self, concurrency: int) -> list[str]:
        return [sys.executable, str(ROOT / "manage.py"), "db_worker", "--no-startup-delay"]

    remaining_sql = f"SELECT count(*) FROM {TABLE} WHERE status IN ('READY', 'RUNNING')"
    first_started_sql = (
        f"SELECT extract(epoch FROM min(started_at)) FROM {TABLE}"
        " WHERE started_at >= to_timestamp(%s)"
    )
    last_finished_sql = f"SELECT extract(epoch FROM max(finished_at)) FROM {TABLE}"
