"""Procrastinate (psycopg connector): ``defer`` / ``batch_defer`` and its worker.

Run as a module, this file is one worker process:
``python -m benchmarks.systems.procrastinate URL CONCURRENCY``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from .base import QUEUE, System


def make_app(url: str) -> Any:
    import procrastinate

    from benchmarks import probe, work

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue=QUEUE)
    async def noop(n: int = 0) -> None:
        probe.started(n)

    @app.task(name="sleep5", queue=QUEUE)
    async def sleep5(n: int = 0) -> None:
        await asyncio.sleep(work.SLEEP_SECONDS)

    return app


class Procrastinate(System):
    name = "procrastinate"
    package = "procrastinate"

    requires = ("procrastinate",)

    def __init__(self, database_url: str) -> None:
        super().__init__(database_url)
        self._app: Any = None
        self._conn: Any = None

    def install(self) -> None:
        import psycopg

        self._app = make_app(self.database_url)
        self._app.open()
        self._conn = psycopg.connect(self.database_url, autocommit=True)
        installed = self._conn.execute(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL"
        ).fetchone()
        if not installed[0]:
            self._app.schema_manager.apply_schema()

    def close(self) -> None:
        if self._app is not None:
            self._app.close()
        if self._conn is not None:
            self._conn.close()

    def reset(self) -> None:
        self._conn.execute(
            "TRUNCATE procrastinate_events, procrastinate_periodic_defers,"
            " procrastinate_jobs, procrastinate_workers CASCADE"
        )

    def enqueue_each(self, count: int) -> None:
        task = self._app.tasks["noop"]
        for n in range(count):
            task.defer(n=n)

    def enqueue_bulk(self, count: int, kind: str = "noop") -> None:
        self._app.tasks[kind].batch_defer(*[{"n": n} for n in range(count)])

    def enqueue_marked(self, marker: int) -> None:
        self._app.tasks["noop"].defer(n=marker)

    worker_command = System.module_worker

    def scalar(self, sql: str, *params: Any) -> Any:
        return self._conn.execute(sql, params).fetchone()[0]

    remaining_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    first_started_sql = (
        "SELECT extract(epoch FROM min(at)) FROM procrastinate_events"
        " WHERE type = 'started' AND at >= to_timestamp(%s)"
    )
    last_finished_sql = (
        "SELECT extract(epoch FROM max(at)) FROM procrastinate_events WHERE type = 'succeeded'"
    )


async def _work(url: str, concurrency: int) -> None:
    app = make_app(url)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, queues=[QUEUE])


if __name__ == "__main__":
    asyncio.run(_work(sys.argv[1], int(sys.argv[2])))
