"""pgqueuer (asyncpg driver): ``Queries.enqueue`` and a ``PgQueuer`` worker.

Run as a module, this file is one worker process:
``python -m benchmarks.systems.pgqueuer URL CONCURRENCY``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from .base import System, WorkerConfig


class Pgqueuer(System):
    name = "pgqueuer"
    package = "pgqueuer"

    requires = ("asyncpg", "pgqueuer")

    def worker_config(self, wanted: WorkerConfig) -> WorkerConfig:
        # pgqueuer has no cheap per-process cap: with an entrypoint concurrency_limit
        # below its batch size, finished jobs hold their slots until the status-log
        # buffer flushes and the worker re-polls every 100 ms (about 40 jobs/s at a
        # limit of 4). It runs with its defaults instead: batches of 10, no limit
        # (concurrency 0 here).
        return WorkerConfig(wanted.processes, 0)

    def __init__(self, database_url: str) -> None:
        super().__init__(database_url)
        self._loop = asyncio.new_event_loop()
        self._conn: Any = None
        self._queries: Any = None

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    def install(self) -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self._conn = self._run(asyncpg.connect(self.database_url))
        self._queries = Queries(AsyncpgDriver(self._conn))
        if not self._run(self._queries.schema_is_installed()):
            self._run(self._queries.install())

    def close(self) -> None:
        if self._conn is not None:
            self._run(self._conn.close())
        self._loop.close()

    def reset(self) -> None:
        self._run(self._conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics"))

    def enqueue_each(self, count: int) -> None:
        async def each() -> None:
            for n in range(count):
                await self._queries.enqueue("noop", str(n).encode())

        self._run(each())

    def enqueue_bulk(self, count: int, kind: str = "noop") -> None:
        payloads = [str(n).encode() for n in range(count)]
        self._run(self._queries.enqueue([kind] * count, payloads, [0] * count))

    def enqueue_marked(self, marker: int) -> None:
        self._run(self._queries.enqueue("noop", str(marker).encode()))

    worker_command = System.module_worker

    def scalar(self, sql: str, *params: Any) -> Any:
        return self._run(self._conn.fetchval(sql, *params))

    remaining_sql = "SELECT count(*) FROM pgqueuer"
    last_finished_sql = (
        "SELECT extract(epoch FROM max(created)) FROM pgqueuer_log WHERE status = 'successful'"
    )


async def _work(url: str, concurrency: int) -> None:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    from benchmarks import probe, work

    pgq = PgQueuer.from_asyncpg_connection(await asyncpg.connect(url))

    @pgq.entrypoint("noop", concurrency_limit=concurrency)
    async def noop(job: Job) -> None:
        probe.started(int(job.payload or b"0"))

    @pgq.entrypoint("sleep5", concurrency_limit=concurrency)
    async def sleep5(job: Job) -> None:
        await asyncio.sleep(work.SLEEP_SECONDS)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, pgq.shutdown.set)
    await pgq.run()


if __name__ == "__main__":
    asyncio.run(_work(sys.argv[1], int(sys.argv[2])))
