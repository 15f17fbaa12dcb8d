"""What the harness needs from each queue it measures."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection

from ..physical import HARNESS_MARK

ROOT = Path(__file__).resolve().parents[2]

#: The queue every system's no-op jobs go to.
QUEUE = "default"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """One burn-down set-up: worker processes and handler concurrency per process."""

    processes: int
    concurrency: int

    @property
    def key(self) -> str:
        return f"{self.processes}p-c{self.concurrency}"


class System(ABC):
    """A job queue under test. All methods run in the harness process, except the
    worker command, which the harness starts as separate processes."""

    #: The handler kinds the system runs as another: its one form of the 5 ms handler.
    kind_aliases: dict[str, str] = {"sleep5async": "sleep5"}

    #: Short name used in the table and the JSON.
    name: str
    #: The PyPI distribution (None for ours).
    package: str | None = None
    #: The modules it needs (the ``bench`` extra installs them).
    requires: tuple[str, ...] = ()
    #: Whether the system has a bulk-enqueue API.
    has_bulk = True
    #: The harness's progress queries, each of one value: the jobs not finished yet;
    #: the epoch seconds of the first start at or after ``%s`` and of the last end,
    #: where the system records them (None: it does not).
    remaining_sql: str
    first_started_sql: str | None = None
    last_finished_sql: str | None = None

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    @classmethod
    def available(cls) -> bool:
        """Whether the modules it needs (:attr:`requires`) are installed."""
        return all(importlib.util.find_spec(module) for module in cls.requires)

    def worker_config(self, wanted: WorkerConfig) -> WorkerConfig:
        """The set-up this system runs for ``wanted`` (some cannot cap concurrency)."""
        return wanted

    def version(self) -> str:
        if self.package is None:
            return "this repository"
        from importlib.metadata import version

        return version(self.package)

    # ------------------------------------------------------------------ set-up

    @abstractmethod
    def install(self) -> None:
        """Create the system's tables in the benchmark database."""

    @abstractmethod
    def reset(self) -> None:
        """Remove every job (and its history) so that a measurement starts empty."""

    def close(self) -> None:
        """Release connections held by the harness process."""
        return None

    def analyze(self, admin: Callable[[str], None]) -> None:
        """Refresh the planner's statistics of the system's tables (``admin`` runs a
        statement in the benchmark database)."""
        admin("ANALYZE")

    # ------------------------------------------------------------------ producing

    @abstractmethod
    def enqueue_each(self, count: int) -> None:
        """Enqueue ``count`` no-op jobs, one API call (and commit) each."""

    def enqueue_bulk(self, count: int, kind: str = "noop") -> None:
        """Enqueue ``count`` jobs of the ``kind`` handler with the bulk API (one call)."""
        raise NotImplementedError

    def seed(self, count: int, kind: str = "noop") -> None:
        """Enqueue ``count`` jobs of the ``kind`` handler so that they all become
        visible at one commit. The kinds: ``noop``; ``sleep5``, which sleeps 5 ms (an
        ``await asyncio.sleep`` in the async peers), as a handler waiting on the network
        does; and, django-ledon only, ``cpu20``, about 20 ms of pure Python
        (``benchmarks.work``); ``sleep5async``, the 5 ms handler as an ``async def``
        where the system has both forms (the peers' handlers are always coroutines)."""
        self.enqueue_bulk(count, self.kind_aliases.get(kind, kind))

    @abstractmethod
    def enqueue_marked(self, marker: int) -> None:
        """Enqueue one job whose handler reports ``marker`` to the start-time probe."""

    # ------------------------------------------------------------------ consuming

    @abstractmethod
    def worker_command(self, concurrency: int) -> list[str]:
        """argv of one worker process that runs until SIGTERM."""

    def worker_env(self) -> dict[str, str]:
        return base_env(self.database_url)

    def module_worker(self, concurrency: int) -> list[str]:
        """argv of a worker that is the system's adapter module run as a script
        (``python -m MODULE URL CONCURRENCY``)."""
        return [sys.executable, "-m", type(self).__module__, self.database_url, str(concurrency)]

    def scalar(self, sql: str, *params: Any) -> Any:
        """The one value ``sql`` selects, on the harness's own connection (Django's
        by default); ``%s`` stands for each of ``params``."""
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()[0]

    def _epoch(self, sql: str | None, *params: Any) -> float | None:
        value = None if sql is None else self.scalar(f"{HARNESS_MARK} {sql}", *params)
        return None if value is None else float(value)

    def remaining(self) -> int:
        """Jobs not finished yet (queued or running)."""
        return int(self.scalar(f"{HARNESS_MARK} {self.remaining_sql}"))

    def first_started_since(self, since: float) -> float | None:
        """Epoch seconds of the first job start at or after ``since``, if recorded."""
        return self._epoch(self.first_started_sql, since)

    def last_finished_at(self) -> float | None:
        """Epoch seconds of the last job's end as the system recorded it, if it does."""
        return self._epoch(self.last_finished_sql)

    def wait_until_done(self, timeout: float, poll: float = 0.05) -> float:
        """Poll until no job is left; the epoch time of the end (the system's own
        timestamp where it records one, else the moment the poll saw it)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.remaining() == 0:
                seen = time.time()
                recorded = self.last_finished_at()
                return recorded if recorded is not None and recorded <= seen else seen
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: jobs left after {timeout:.0f} s")
            time.sleep(poll)


def base_env(database_url: str) -> dict[str, str]:
    # Workers keep their modules' bytecode, as an installed copy does: with
    # PYTHONDONTWRITEBYTECODE every start would compile every module again.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["DATABASE_URL"] = database_url
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env
