"""The base of the long-running engines: the job ``Worker``, the outbox ``Dispatcher``
and ``EventConsumer``, the ``SagaRunner``.

**Stopping** has three levels; every request (:meth:`Engine.request_stop`, one per
signal) goes one level further:

1. ``GRACEFUL`` — take no new work; let the work under way finish (each engine says
   how long it waits);
2. ``CANCEL`` — signal cancellation to the work under way, at once;
3. ``ABORT`` — stop waiting: recover what can be recovered (re-queue attempts,
   release leases) and return.

**Signals** (:meth:`Engine.stop_on_signals`): the Python-level handler does nothing;
the interpreter writes the signal's number to a pipe (:func:`signal.set_wakeup_fd`)
and a watcher thread reads it and requests the stop. Nothing that takes a lock ever
runs inside a signal handler, so a signal that lands while the main thread holds a
lock (inside ``Event.wait()``, say) cannot deadlock it. After the third signal, if
``run()`` has not returned within :attr:`Engine.abort_timeout` seconds, the process
exits with status 1: a call stuck on the network cannot keep it alive.

**Database steps** (:meth:`Engine.guarded`): a database error drops the thread's
broken connection, is reported through the engine's
:class:`~ledon.outage.OutageReporter` (once per outage, not once per attempt) and
makes the engine's next wait (:meth:`Engine.pause`) the back-off delay, cut short
only by a stop. Steps are skipped until that wait is over, so one pass of an engine's
loop touches a database that is down once.

**Deadlines** (:mod:`ledon.deadline`): while ``run()`` runs, every round trip of the
process's PostgreSQL connections is watched; one that gets no reply because the
connection went silent is broken, and fails like a lost connection.

**The workers registry** (:mod:`ledon.registry`): every subclass's ``run()`` is
wrapped so that, while it runs, the engine keeps its row in the registry (written once
:meth:`Engine.wait_for_database` succeeded, renewed by a heartbeat thread, deleted when
``run()`` returns). Subclasses say who they are in :meth:`Engine.registry_record` and
how much work they hold in :meth:`Engine.running_count`.

**Start-up** (:meth:`Engine.wait_for_database`): an unreachable database is waited
for, with the same back-off and reporting; a database that answers without the app's
tables raises :class:`~ledon.db.DatabaseNotMigrated`, a clear error naming
``migrate``.

**The clock** (:mod:`ledon.clock`): once the database answered at start-up, the
offset of its server's clock from this host's is measured, and again every half
minute while ``run()`` runs; every engine reads its time with it
(:func:`ledon.clock.now`), so that a host whose clock is off reads the time the
others read.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from django.apps import apps
from django.db import connections

from . import clock
from .backoff import Backoff
from .db import (
    DATABASE_ERRORS,
    TRANSIENT_ERRORS,
    DatabaseNotMigrated,
    missing_tables,
    reset_connection,
)
from .deadline import protect_engine_connections
from .outage import OutageReporter
from .registry import EngineRecord, Registration
from .registry import installed as installed_registry

logger = logging.getLogger(__name__)

#: Exit status of a process that a third signal ended because ``run()`` did not return.
EXIT_ABORTED = 1

#: What ``stop_on_signals`` calls after each signal: (signal, level reached).
Announce = Callable[[signal.Signals, "StopLevel"], None]


class StopLevel(enum.IntEnum):
    RUNNING = 0
    GRACEFUL = 1
    CANCEL = 2
    ABORT = 3


class Failed(enum.Enum):
    """What :meth:`Engine.guarded` returns when its step failed on the database."""

    FAILED = "failed"


FAILED = Failed.FAILED


class EngineStats:
    """The base of what an engine's ``run()`` returns: its counters (``int`` fields of
    a slotted dataclass), :meth:`count` of the outcomes it sees, and :meth:`summary`,
    the line its management command prints at the end.

    An outcome (a member of an enum) counts on the counter :attr:`counters` maps it
    to; by default on the counter named after its value.
    """

    __slots__ = ()

    #: The counter each outcome adds one to, where it is not named after its value.
    counters: ClassVar[Mapping[enum.Enum, str]] = {}
    #: The ``(label, counter)`` parts that end the summary line, each shown only when
    #: its count is not zero.
    if_any: ClassVar[tuple[tuple[str, str], ...]] = ()

    def count(self, outcome: enum.Enum) -> None:
        """One more of ``outcome``."""
        name = self.counters.get(outcome) or str(outcome.value)
        setattr(self, name, getattr(self, name) + 1)

    def summary(self) -> str:
        """The counters in one line: :meth:`counted`, then ``, <label> <count>`` for
        each part of :attr:`if_any` whose count is not zero."""
        return self.counted() + "".join(
            f", {label} {getattr(self, name)}" for label, name in self.if_any if getattr(self, name)
        )

    def counted(self) -> str:
        """The summary line but for its :attr:`if_any` parts."""
        raise NotImplementedError


@dataclass(slots=True)
class ClaimStats(EngineStats):
    """The counters of an engine that claims rows under a lease and finishes them (the
    job worker, the outbox dispatcher): what it ``claimed``, the retries it scheduled
    (``retried``), the rows it ``recovered`` from expired leases, the rows its
    retention ``purged``, and the finishes refused because its lease was no longer
    current (``stale``: it was fenced off)."""

    claimed: int = 0
    retried: int = 0
    recovered: int = 0
    purged: int = 0
    stale: int = 0

    if_any: ClassVar[tuple[tuple[str, str], ...]] = (("stale (fenced off)", "stale"),)


#: What an engine tells its management command of what it does: (event, detail).
EventCallback = Callable[[str, str], None]


class EmitsEvents:
    """An engine whose ``on_event`` hears ``(event, detail)`` (the outbox's engines)."""

    on_event: EventCallback | None

    def _emit(self, event: str, detail: str = "") -> None:
        if self.on_event is not None:
            self.on_event(event, detail)


class Engine:
    """What every engine shares: stop levels, signals, guarded database steps.

    Subclasses call ``super().__init__(alias=…, log=…)`` first, wait with
    :meth:`pause` (never on an event of their own that a signal should interrupt),
    and react to stop levels in :meth:`_stop_level_reached`.
    """

    #: The engine's name in messages ("worker", "dispatcher", …).
    kind: ClassVar[str] = "engine"
    #: The app whose tables the engine needs (see :meth:`wait_for_database`).
    app_label: ClassVar[str] = ""
    #: Seconds ``run()`` gets to return after the third signal before the process exits.
    abort_timeout: ClassVar[float] = 10.0

    def __init__(self, *, alias: str, log: logging.Logger, backoff: Backoff | None = None) -> None:
        self.alias = alias
        self.backoff = backoff or Backoff()
        self.outage = OutageReporter(log, "database")
        self._stop_lock = threading.Lock()
        self._stop_level = StopLevel.RUNNING
        #: Set at GRACEFUL and above; CANCEL and ABORT have their own.
        self._stopping = threading.Event()
        self._cancelling = threading.Event()
        self._aborting = threading.Event()
        #: Set when there may be work, or the stop level changed.
        self._wake = threading.Event()
        #: Set once the engine is at work (the database answered, its start-up steps
        #: ran; for a consumer, its subscription opened).
        self.started = threading.Event()
        #: Set by a failed database step until the next :meth:`pause` has backed off.
        self._backing_off = threading.Event()
        self._delay = 0.0
        #: Set once the database answered at start-up (the registry row is written then).
        self._database_ready = threading.Event()
        self._registration: Registration | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if run is None or getattr(run, "_registered", False):
            return

        @functools.wraps(run)
        def registered_run(self: Engine, *args: Any, **kwargs: Any) -> Any:
            protect_engine_connections(self.alias)
            with self.registered(), self.clock_kept():
                return run(self, *args, **kwargs)

        registered_run._registered = True  # type: ignore[attr-defined]
        cls.run = registered_run  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ registry

    def registry_record(self) -> EngineRecord:
        """Who this engine is, for the workers registry (subclasses say more)."""
        return EngineRecord(kind=self.kind, engine_id=f"{os.getpid()}")

    def running_count(self) -> int:
        """How much work the engine holds now (jobs running, instances driven…)."""
        return 0

    @contextmanager
    def registered(self) -> Iterator[None]:
        """The engine's row in the workers registry while the block runs (see
        :mod:`ledon.registry`); nothing when no registry is installed, when the engine
        runs inside an open transaction (a test's), or when a row is already kept."""
        store = installed_registry()
        if (
            store is None
            or self._registration is not None
            or connections[self.alias].in_atomic_block
        ):
            yield
            return
        registration = Registration(
            store,
            self.registry_record(),
            alias=self.alias,
            running=self.running_count,
            ready=self._database_ready,
            engine_outage=self.outage,
        )
        self._registration = registration
        registration.start()
        try:
            yield
        finally:
            registration.close()
            self._registration = None

    @contextmanager
    def clock_kept(self) -> Iterator[None]:
        """While the block runs, the database's clock is measured again now and then
        (:class:`~ledon.clock.ClockKeeper`; :meth:`wait_for_database` measures it
        first); on SQLite, whose clock is this host's, nothing runs."""
        if connections[self.alias].vendor != "postgresql":
            yield
            return
        keeper = clock.ClockKeeper(self.alias).start()
        try:
            yield
        finally:
            keeper.close()

    # ------------------------------------------------------------------ stopping

    @property
    def stop_level(self) -> StopLevel:
        return self._stop_level

    def request_stop(self) -> StopLevel:
        """One more stop request — graceful, then cancel, then abort; the level reached.

        Call it from any thread, not from a signal handler (it takes locks): use
        :meth:`stop_on_signals` for signals.
        """
        with self._stop_lock:
            level = StopLevel(min(self._stop_level + 1, StopLevel.ABORT))
        self.escalate(level)
        return level

    def escalate(self, level: StopLevel) -> None:
        """Raise the stop level to ``level`` (a lower or equal level changes nothing)."""
        with self._stop_lock:
            if level <= self._stop_level:
                return
            self._stop_level = level
        if level >= StopLevel.GRACEFUL:
            self._stopping.set()
        if level >= StopLevel.CANCEL:
            self._cancelling.set()
        if level >= StopLevel.ABORT:
            self._aborting.set()
        self._wake.set()
        self._stop_level_reached(level)

    def _stop_level_reached(self, level: StopLevel) -> None:
        """Hook: the stop level just rose to ``level`` (runs on the requesting thread)."""

    def stop(self) -> None:
        """Take no new work, finish what is under way, then return from ``run()``
        (the first level of :meth:`request_stop`)."""
        self.escalate(StopLevel.GRACEFUL)

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested."""
        return self._stopping.is_set()

    def wake(self) -> None:
        """End the loop's current wait (there may be work); any thread may call it."""
        self._wake.set()

    @contextmanager
    def stop_on_signals(
        self,
        announce: Announce | None = None,
        signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
    ) -> Iterator[None]:
        """While the block runs, each of ``signals`` is one :meth:`request_stop`;
        ``announce(signal, level)`` is called after each, on the watcher thread.
        Outside the main thread (where signals cannot be caught) this does nothing."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        watcher = _SignalWatcher(self, signals, announce)
        watcher.start()
        try:
            yield
        finally:
            watcher.close()

    # ------------------------------------------------------------------ database

    @property
    def backing_off(self) -> bool:
        """Whether a database step failed and the engine has not backed off since."""
        return self._backing_off.is_set()

    def guarded[T](self, what: str, call: Callable[[], T]) -> T | Failed:
        """Run one database step of the engine's loop; :data:`FAILED` if it failed on
        the database (reported, connection reset, back-off due) or was skipped because
        another step failed since the last back-off."""
        if self._backing_off.is_set():
            return FAILED
        began = self.outage.clock()
        try:
            result = call()
        except DATABASE_ERRORS as exc:
            self.database_failed(what, exc, began=began)
            return FAILED
        if not self._backing_off.is_set():  # nothing inside the step failed either
            self.database_ok()
        return result

    def database_failed(self, what: str, exc: Exception, *, began: float | None = None) -> float:
        """Record a failed database step: reset this thread's connection if broken,
        report, and make the next :meth:`pause` back off. Returns the back-off delay
        (for a caller that retries on its own thread). ``began``: when the step began
        (``self.outage.clock()``), so that a step begun during an outage that fails
        just after it is not reported as a new one."""
        reset_connection(self.alias)
        delay = self.backoff.next_delay()
        self._delay = delay
        self._backing_off.set()
        self.outage.failed(
            exc,
            doing=what,
            retry_in=self.backoff.ceiling,
            unreachable=isinstance(exc, TRANSIENT_ERRORS),
            began=began,
        )
        return delay

    def database_ok(self) -> None:
        """A database step succeeded: the outage (if any) is over, the back-off resets
        — provided the step reached the database (this thread's connection is open:
        a failure closes it, and a step with nothing to do proves nothing)."""
        if not (self.outage.active or self.backoff.failures):
            return
        if connections[self.alias].connection is None:
            return
        self.backoff.reset()
        self.outage.recovered()

    def retry_database[T](
        self,
        what: str,
        call: Callable[[], T],
        *,
        until: threading.Event | None = None,
        attempts: int = 4,
    ) -> T:
        """Run ``call`` until it succeeds, backing off between tries: errors that say
        "not now" (:data:`~ledon.db.TRANSIENT_ERRORS`) without limit, other database
        errors ``attempts`` times in all. Gives up — re-raising the last error — when
        ``until`` (default: an abort) is set."""
        stop = until or self._aborting
        failures = 0
        while True:
            began = self.outage.clock()
            try:
                result = call()
            except DATABASE_ERRORS as exc:
                failures += 1
                delay = self.database_failed(what, exc, began=began)
                exhausted = not isinstance(exc, TRANSIENT_ERRORS) and failures >= attempts
                if exhausted or stop.wait(delay):
                    raise
                continue
            self.database_ok()
            return result

    def pause(self, timeout: float, *, until: threading.Event | None = None) -> None:
        """The loop's wait: up to ``timeout`` seconds or until woken — or, after a
        failed database step, the back-off delay, cut short only by ``until``
        (default: a stop request)."""
        if self._backing_off.is_set():
            (until or self._stopping).wait(self._delay)
            self._backing_off.clear()
        else:
            self._wake.wait(timeout)

    def reset_connection(self) -> None:
        reset_connection(self.alias)

    def wait_for_database(self) -> bool:
        """At start-up: wait until the database answers, backing off and reporting
        meanwhile; False if a stop came first. Raises
        :class:`~ledon.db.DatabaseNotMigrated` when it answers without the tables of
        :attr:`app_label`, or of an app whose code runs in this engine
        (:func:`runs_inside`)."""
        tables = {label: _tables_of(label) for label in _needed_apps(self.app_label)}
        while not self._stopping.is_set():
            began = self.outage.clock()
            try:
                missing = missing_tables(self.alias, [t for ts in tables.values() for t in ts])
                # Before the engine reads its clock for the first time: its leases,
                # recoveries and claims are read on the database's clock.
                clock.align(self.alias)
            except DATABASE_ERRORS as exc:
                delay = self.database_failed(
                    f"connecting to database {self.alias!r}", exc, began=began
                )
                self._stopping.wait(delay)
                self._backing_off.clear()
                continue
            self.database_ok()
            for label, own in tables.items():
                lacking = [table for table in own if table in missing]
                if lacking:
                    raise DatabaseNotMigrated(self.alias, label, lacking, self.kind)
            self._database_ready.set()
            return True
        return False


#: The apps whose code runs inside the engines of another app, by that app's label:
#: the workflows' job handlers run in the jobs' workers.
_guests: dict[str, list[str]] = {}


def runs_inside(host: str, guest: str) -> None:
    """Say that app ``guest``'s code runs inside the engines of app ``host`` (its
    handlers in their loop): such an engine refuses to start, as for its own tables,
    while the database lacks ``guest``'s tables — every piece of its work that
    touches them would fail. Called from the guest's ``ready()``; idempotent."""
    guests = _guests.setdefault(host, [])
    if guest not in guests:
        guests.append(guest)


def _needed_apps(app_label: str) -> list[str]:
    """``app_label`` (none if empty), then the installed apps that run inside it."""
    if not app_label:
        return []
    return [app_label, *(g for g in _guests.get(app_label, ()) if apps.is_installed(g))]


def _tables_of(app_label: str) -> list[str]:
    return [
        model._meta.db_table
        for model in apps.get_app_config(app_label).get_models()
        if model._meta.managed and not model._meta.proxy
    ]


def _ignore(signum: int, frame: object) -> None:
    """The Python-level handler: nothing. The wake-up fd carries the signal."""


class _SignalWatcher:
    """Turns ``signals`` into stop requests of ``engine`` from a thread of its own."""

    def __init__(
        self, engine: Engine, signals: Sequence[signal.Signals], announce: Announce | None
    ) -> None:
        self.engine = engine
        self.signals = list(signals)
        self.announce = announce
        self._numbers = {int(s) for s in self.signals}
        self._done = threading.Event()
        self._aborting = False
        self._previous: dict[signal.Signals, Any] = {}
        self._previous_fd = -1
        self._read, self._write = os.pipe()
        # The interpreter writes from its C-level handler: the pipe must not block.
        os.set_blocking(self._write, False)
        self._thread = threading.Thread(
            target=self._watch, name=f"{engine.kind}-signals", daemon=True
        )

    def start(self) -> None:
        try:
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, _ignore)
            self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except BaseException:
            self._restore()
            os.close(self._write)
            os.close(self._read)
            raise
        self._thread.start()

    def close(self) -> None:
        self._done.set()
        self._restore()
        os.close(self._write)  # the watcher reads end-of-file and returns
        self._thread.join(timeout=5)
        os.close(self._read)

    def _restore(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:
                return
            for number in data:
                if number in self._numbers:
                    self._received(signal.Signals(number))

    def _received(self, signum: signal.Signals) -> None:
        # Announced before the engine hears it, so that the announcement comes
        # before whatever the engine says about stopping.
        level = StopLevel(min(self.engine.stop_level + 1, StopLevel.ABORT))
        if self.announce is not None:
            try:
                self.announce(signum, level)
            except Exception:
                logger.exception("reporting %s failed", signum.name)
        self.engine.escalate(level)
        if level is StopLevel.ABORT and not self._aborting:
            self._aborting = True
            threading.Thread(
                target=self._exit_if_stuck, name=f"{self.engine.kind}-abort", daemon=True
            ).start()

    def _exit_if_stuck(self) -> None:
        timeout = self.engine.abort_timeout
        if self._done.wait(timeout):
            return
        logger.error(
            "%s did not stop within %.0f s of the last signal; exiting now (what it "
            "still held is recovered when its leases expire)",
            self.engine.kind,
            timeout,
        )
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_ABORTED)
