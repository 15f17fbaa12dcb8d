"""The workers registry: every running engine — job worker, outbox dispatcher,
event consumer, saga runner — keeps a row saying who it is and that it is alive.

This module holds no table: it defines what an engine records (:class:`EngineRecord`)
and the interface of the store that keeps the rows (:class:`RegistryStore`). The
``jobs`` app installs its store (the ``jobs_workerrecord`` table) in its ``ready()``;
without ``jobs`` installed nothing is recorded. :class:`~ledon.engine.Engine` runs a
:class:`Registration` around every engine's ``run()``:

- once the engine's database answers, its row is written (an earlier row of the same
  kind and id — a previous run that was killed — is replaced);
- every ``heartbeat_seconds``, from a thread of its own, the row's heartbeat and
  running count are renewed; when the row is written and every
  :data:`CLEAN_UP_EVERY` heartbeats after, rows silent for longer than the store's
  retention are deleted (any engine's, a killed one's);
- when ``run()`` returns, the row is deleted. A process killed with SIGKILL leaves its
  row, whose heartbeat then grows old: the admin shows it as silent.

The heartbeat thread uses a connection of its own, so a heartbeat alone does not prove
the engine works: every heartbeat also carries the engine's own health, read from its
outage reporter (``engine_outage``), and an engine whose database steps fail —
unreachable, or a round trip stuck past its deadline — is shown as *unhealthy*, not
live, for as long as that lasts.

An engine run inside an open transaction (a test's) is not recorded. A registry write
that fails is said once per outage and tried again at the next heartbeat; it never
stops the engine. A write that finds SQLite busy (another connection of the process,
or another process, holds its write lock: with Django's default SQLite settings a
worker's own threads do, all the time) is book-keeping that can wait: it is tried
again for up to :data:`BUSY_WAIT_SECONDS`, then left to the next heartbeat with one
DEBUG line, never reported as an outage.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from importlib.metadata import PackageNotFoundError, distribution
from typing import Protocol

from django.db import connections

from .clock import now as database_now
from .db import DATABASE_ERRORS
from .outage import OutageReporter

logger = logging.getLogger(__name__)

#: Seconds a registry write waits, in all, for a busy SQLite database before it is
#: left to the next heartbeat.
BUSY_WAIT_SECONDS = 2.0
#: The first pause between two tries at a busy database (doubled each time, to 0.25 s).
BUSY_FIRST_PAUSE = 0.01

#: SQLite's primary result codes that mean "the lock is held by someone else".
_SQLITE_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def is_sqlite_busy(exc: BaseException) -> bool:
    """Whether ``exc`` (a Django database error) is SQLite saying its write lock is
    held by another connection: ``SQLITE_BUSY`` or ``SQLITE_LOCKED``, extended codes
    included, read from the driver's error code rather than its message."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in _SQLITE_BUSY_CODES:
            return True
        current = current.__cause__ or current.__context__
    return False


#: Heartbeats between two clean-ups of rows silent past the retention, by each engine
#: (five minutes at the default heartbeat of ten seconds).
CLEAN_UP_EVERY = 30


@functools.cache
def package_version() -> str:
    """The installed django-ledon's version, read from its metadata's ``Version``
    header: parsing the whole metadata (the README is its body) cost every engine's
    start-up more than the rest of its registration."""
    try:
        dist = distribution("django-ledon")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    headers = text.split("\n\n", 1)[0]
    for line in headers.splitlines():
        name, _, value = line.partition(":")
        if name == "Version":
            return value.strip()
    return dist.version  # pragma: no cover - metadata without the header


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineRecord:
    """What an engine says about itself in the registry."""

    kind: str
    engine_id: str
    queues: tuple[str, ...] = ()
    concurrency: int = 1
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    version: str = field(default_factory=package_version)
    #: Distinguishes this run from an earlier one with the same kind and id.
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


class RegistryStore(Protocol):
    """Where the rows live (installed by the ``jobs`` app)."""

    @property
    def heartbeat_seconds(self) -> float:
        """Seconds between two heartbeats of each engine."""
        ...

    def register(
        self, record: EngineRecord, *, running: int, now: datetime, unhealthy: str = ""
    ) -> None:
        """Write the engine's row (replacing one of the same kind and id)."""
        ...

    def heartbeat(
        self, record: EngineRecord, *, running: int, now: datetime, unhealthy: str = ""
    ) -> bool:
        """Renew the row; False if it is gone (deleted, or replaced by another run).
        ``unhealthy`` is why the engine does not work now ("": it does)."""
        ...

    def remove(self, record: EngineRecord) -> None:
        """Delete the row, if it is still this run's."""
        ...

    def clean_up(self, *, now: datetime) -> int:
        """Delete rows silent for longer than the retention; how many."""
        ...


_store: RegistryStore | None = None


def install(store: RegistryStore | None) -> None:
    """Make ``store`` the registry's (None: record nothing)."""
    global _store
    _store = store


def installed() -> RegistryStore | None:
    return _store


@dataclass(eq=False)
class Registration:
    """The row of one engine while it runs: written once ``ready`` is set, renewed
    every heartbeat, deleted by :meth:`close`. ``running`` counts the engine's running
    work for each heartbeat."""

    store: RegistryStore
    record: EngineRecord
    _: KW_ONLY
    alias: str
    running: Callable[[], int]
    ready: threading.Event
    #: The engine's own outage reporter: while it has an outage under way (the
    #: engine's database steps fail), every heartbeat says the engine is unhealthy.
    engine_outage: OutageReporter | None = None
    clock: Callable[[], datetime] = database_now
    #: Set while the engine's row is written.
    registered: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        record = self.record
        self.outage = OutageReporter(
            logger, "workers registry", level=logging.WARNING, extra={"worker": record.engine_id}
        )
        self._beats = 0
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=self._main, name=f"{record.kind}-registry", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the heartbeats and delete the row (a clean exit)."""
        self._closing.set()
        self.ready.set()  # an engine that never reached its database: nothing to wait for
        self._thread.join(timeout)

    def _main(self) -> None:
        try:
            self.ready.wait()
            interval = self.store.heartbeat_seconds
            while not self._closing.is_set():
                self._beat()
                self._closing.wait(interval)
            if self.registered.is_set():
                self._step("removing its row", lambda: self.store.remove(self.record))
        finally:
            connections.close_all()

    def _beat(self) -> None:
        now = self.clock()
        running = self._running()
        unhealthy = self._health()
        if self.registered.is_set():
            kept = self._step(
                "renewing its heartbeat",
                lambda: self.store.heartbeat(
                    self.record, running=running, now=now, unhealthy=unhealthy
                ),
            )
            if kept is not False:
                self._beats += 1
                if self._beats % CLEAN_UP_EVERY == 0:
                    self._step("deleting old rows", lambda: self.store.clean_up(now=now))
                return
            self.registered.clear()  # the row is gone: write it again

        def register() -> bool:
            self.store.register(self.record, running=running, now=now, unhealthy=unhealthy)
            return True

        if self._step("recording the engine", register):
            self.registered.set()
            self._step("deleting old rows", lambda: self.store.clean_up(now=now))

    def _running(self) -> int:
        try:
            return self.running()
        except Exception:  # a count is advisory; never stop the heartbeat for it
            logger.exception("counting the running work of %s failed", self.record.engine_id)
            return 0

    def _health(self) -> str:
        """Why the engine does not work now ("" when it does)."""
        outage = self.engine_outage
        if outage is None or not outage.active:
            return ""
        return f"database steps failing ({outage.attempts} failed attempts)"

    def _step[T](self, what: str, call: Callable[[], T]) -> T | None:
        pause, waited = BUSY_FIRST_PAUSE, 0.0
        while True:
            try:
                result = call()
            except DATABASE_ERRORS as exc:
                if not is_sqlite_busy(exc):
                    self.outage.failed(exc, doing=what, retry_in=self.store.heartbeat_seconds)
                    return None
                if waited >= BUSY_WAIT_SECONDS:
                    logger.debug(
                        "workers registry: %s found SQLite busy for %.1f s; the next "
                        "heartbeat tries again",
                        what,
                        waited,
                        extra={"worker": self.record.engine_id, "doing": what},
                    )
                    return None
                # A bounded, growing pause: the lock's holder commits within moments.
                time.sleep(pause)
                waited += pause
                pause = min(pause * 2, 0.25)
                continue
            finally:
                # One short write every heartbeat: hold no connection in between.
                connections[self.alias].close()
            if self.outage.active:
                self.outage.recovered()
            return result
