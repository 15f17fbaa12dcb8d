"""Deadlines on database round trips: a silent connection becomes an error.

A round trip to PostgreSQL waits for the server's reply. When the path between the
process and the server stops carrying bytes without closing the connection (a
partition, a stalled proxy or NAT, a paused server host), nothing in the client ends
that wait: the server's ``statement_timeout`` cannot act on a statement it never
received or whose reply it cannot deliver, and TCP keepalives and
``tcp_user_timeout`` (which :func:`apply_connection_defaults` sets) only help when
the kernel at the far end stops acknowledging — not behind a proxy or load balancer
that still does.

So an engine process watches every round trip of its psycopg connections
(:func:`watch`, installed on each connection Django opens once an engine runs,
:func:`protect_engine_connections`): a :class:`Watchdog` thread looks at those that
have waited longer than the deadline (``LEDON_ROUND_TRIP_DEADLINE``, default
:data:`DEFAULT_DEADLINE` seconds) and asks the server, over a fresh connection with
the same parameters and the deadline as its timeout, what each one's backend is
doing:

- the backend is running a statement (a long query, a lock wait): the round trip is
  alive, and is asked about again after another deadline — a slow statement is
  never broken by this;
- the backend is idle or gone (the statement never arrived, or its reply was lost),
  or the server cannot be reached in time: the reply will never come. (Behind a
  transaction pooler the backend cannot be named; there only a server that does not
  answer counts.) The watchdog
  shuts the connection's socket down; the waiting thread gets an ``OperationalError``
  at once, which its engine handles like any lost connection (one outage line, the
  back-off, a new connection).

A silent connection thus becomes an outage within about two deadlines.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

logger = logging.getLogger(__name__)

#: Seconds a round trip may wait before the watchdog asks the server about it.
DEFAULT_DEADLINE = 10.0

#: libpq options every PostgreSQL connection of an engine process gets unless
#: ``DATABASES[alias]['OPTIONS']`` sets them: an idle connection is probed after 10 s
#: of silence (then every 5 s, dropped after 3 unanswered probes), and data the server
#: does not acknowledge within 30 s breaks the connection. A connection attempt gives
#: up after the round-trip deadline (at least 2 s: libpq's minimum), so that a silent
#: server costs an engine no more to connect to than to talk to.
CONNECTION_DEFAULTS: Mapping[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


def configured_deadline() -> float | None:
    """``LEDON_ROUND_TRIP_DEADLINE`` (seconds; None turns the watchdog off)."""
    value = getattr(settings, "LEDON_ROUND_TRIP_DEADLINE", DEFAULT_DEADLINE)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ImproperlyConfigured(
            f"LEDON_ROUND_TRIP_DEADLINE must be a positive number of seconds or None, not {value!r}"
        )
    return float(value)


def apply_connection_defaults(alias: str, deadline: float | None) -> None:
    """Give ``alias``'s future connections the libpq options of
    :data:`CONNECTION_DEFAULTS` (and ``connect_timeout``: ``deadline``, by default
    :data:`DEFAULT_DEADLINE`) that its ``OPTIONS`` do not set (PostgreSQL only)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return
    options = connection.settings_dict.setdefault("OPTIONS", {})
    for key, value in CONNECTION_DEFAULTS.items():
        options.setdefault(key, value)
    options.setdefault("connect_timeout", max(2, round(deadline or DEFAULT_DEADLINE)))


def connection_params(connection: BaseDatabaseWrapper) -> dict[str, Any]:
    """What ``psycopg.connect`` needs to open another connection like ``connection``'s."""
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    return params


class _RoundTrip(NamedTuple):
    """One wait on a connection's reply (a tuple: one is made per round trip)."""

    params: Mapping[str, Any]
    pid: int
    fd: int
    started: float
    thread: threading.Thread
    #: Through a transaction pooler: ``pid`` is the pooler's, not a server backend's.
    pooled: bool


class Watchdog:
    """Breaks round trips whose connection went silent (see the module docstring).

    One per process (:func:`watchdog`); its thread starts with the first watched
    round trip. ``probe(params, pids, timeout)`` answers, for a server, each backend's
    ``state`` from ``pg_stat_activity`` (None: the server did not answer in time).
    """

    def __init__(
        self,
        deadline: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        probe: Callable[[Mapping[str, Any], list[int], float], dict[int, str] | None] | None = None,
    ) -> None:
        self.deadline = deadline
        self.clock = clock
        self.probe = probe or probe_backends
        self._lock = threading.Lock()
        self._waiting: dict[int, _RoundTrip] = {}
        #: When the watchdog last found a late round trip's statement still running.
        self._alive: dict[int, float] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        #: Round trips broken so far (for tests and figures).
        self.broken = 0

    def begin(self, params: Mapping[str, Any], pid: int, fd: int, *, pooled: bool = False) -> int:
        """A round trip on the connection to backend ``pid`` (socket ``fd``) starts;
        its token for :meth:`end`. On every round trip: kept to a tuple and a lock."""
        token = next(self._tokens)
        trip = _RoundTrip(params, pid, fd, self.clock(), threading.current_thread(), pooled)
        with self._lock:
            self._waiting[token] = trip
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="ledon-round-trip-watchdog", daemon=True
                )
                self._thread.start()
        return token

    def end(self, token: int) -> None:
        with self._lock:
            self._waiting.pop(token, None)
            if self._alive:
                self._alive.pop(token, None)

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        interval = min(1.0, self.deadline / 4)
        while not self._closed.wait(interval):
            try:
                self.check()
            except Exception:  # the watchdog must outlive a bug in one pass
                logger.exception("checking database round trips failed")

    def check(self) -> int:
        """One pass: probe the servers of the round trips past their deadline and
        break those whose backend is not working on them; how many it broke."""
        now = self.clock()
        with self._lock:
            late = {
                token: trip
                for token, trip in self._waiting.items()
                if now - self._alive.get(token, trip.started) >= self.deadline
            }
        by_server: dict[tuple[tuple[str, str], ...], list[tuple[int, _RoundTrip]]] = {}
        for token, trip in late.items():
            key = tuple(sorted((k, str(v)) for k, v in trip.params.items()))
            by_server.setdefault(key, []).append((token, trip))
        broken = 0
        for trips in by_server.values():
            params = trips[0][1].params
            states = self.probe(params, [trip.pid for _, trip in trips], self.deadline)
            checked = self.clock()
            for token, trip in trips:
                state = None if states is None else states.get(trip.pid)
                # Behind a pooler the backend cannot be named: a server that answers
                # is all the probe can tell, and it is taken as the statement running.
                alive = states is not None and trip.pooled
                if alive or (state is not None and state.startswith("active")):
                    with self._lock:  # a statement still running: ask again later
                        if token in self._waiting:
                            self._alive[token] = checked
                    continue
                if self._break(token, trip, now, "unreachable" if states is None else state):
                    broken += 1
        return broken

    def _break(self, token: int, trip: _RoundTrip, now: float, why: str | None) -> bool:
        # Under the lock, and only while the wait is registered: its connection (so
        # its socket's number) cannot be closed and reused meanwhile.
        with self._lock:
            if self._waiting.get(token) is not trip:
                return False
            with contextlib.suppress(OSError):
                sock = socket.socket(fileno=os.dup(trip.fd))
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                finally:
                    sock.close()
            self.broken += 1
        logger.warning(
            "a database round trip of thread %s got no reply for %.0f s (server: %s); "
            "breaking its connection",
            trip.thread.name,
            now - trip.started,
            why or "backend gone",
            extra={"backend_pid": trip.pid, "waited": round(now - trip.started, 1)},
        )
        return True


def probe_backends(
    params: Mapping[str, Any], pids: list[int], timeout: float
) -> dict[int, str] | None:
    """Each of ``pids``' state in ``pg_stat_activity`` on the server ``params`` name,
    asked over a new connection that gives up after ``timeout`` seconds; None if the
    server did not answer in time."""
    # psycopg is the [postgres] extra: only PostgreSQL set-ups ever probe.
    import psycopg

    try:
        conn = psycopg.connect(
            **{**params, "connect_timeout": max(2, round(timeout))}, autocommit=True
        )
    except Exception:
        return None
    try:
        # Connection.wait takes a timeout that no public call passes on.
        conn.wait = _with_timeout(conn, timeout)  # type: ignore[method-assign]
        rows = conn.execute(
            "SELECT pid, state FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
        ).fetchall()
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    return {int(pid): str(state or "") for pid, state in rows}


def _with_timeout(conn: Any, timeout: float) -> Callable[..., Any]:
    original = conn.wait

    def wait(gen: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", timeout)
        return original(gen, *args, **kwargs)

    return wait


_watchdog: Watchdog | None = None
_watchdog_lock = threading.Lock()


def watchdog() -> Watchdog | None:
    """The process's watchdog (None until an engine protected its connections, or
    with the deadline off)."""
    return _watchdog


def watch(
    conn: Any, params: Mapping[str, Any], *, by: Watchdog | None = None, pooled: bool = False
) -> None:
    """Watch every round trip of the psycopg connection ``conn`` (opened with
    ``params``; ``pooled``: through a transaction pooler) from now on, by ``by``
    (default: the process's watchdog); nothing if no watchdog runs or it is already
    watched."""
    dog = by or _watchdog
    if dog is None or getattr(conn, "_ledon_watched", False):
        return
    pgconn = conn.pgconn
    pid, fd = pgconn.backend_pid, pgconn.socket
    original = conn.wait

    def wait(gen: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is not None:
            # A wait bounded by its caller (``notifies(timeout=…)``) is no round trip:
            # it may rightly hear nothing.
            return original(gen, *args, **kwargs)
        token = dog.begin(params, pid, fd, pooled=pooled)
        try:
            return original(gen, *args, **kwargs)
        finally:
            dog.end(token)

    # psycopg calls ``self.wait`` / ``self._conn.wait`` for every round trip
    # (statements, pipelines, commits, rollbacks, server-side cursors).
    conn.wait = wait
    conn._ledon_watched = True


def _connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if connection.vendor == "postgresql" and connection.connection is not None:
        watch(connection.connection, connection_params(connection), pooled=_pooled(connection))


def _pooled(connection: BaseDatabaseWrapper) -> bool:
    # What Django requires behind a transaction pooler (as ledon.pglisten.is_pooled).
    return bool(connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"))


def protect_engine_connections(alias: str) -> None:
    """For an engine on ``alias``: the libpq defaults on its connections, and — with a
    deadline configured — the watchdog on every connection Django opens from now on
    in this process (and on this thread's open one). Idempotent."""
    global _watchdog
    if connections[alias].vendor != "postgresql":
        return
    deadline = configured_deadline()
    apply_connection_defaults(alias, deadline)
    if deadline is None:
        return
    with _watchdog_lock:
        if _watchdog is None:
            _watchdog = Watchdog(deadline)
            connection_created.connect(_connection_created, dispatch_uid="ledon.deadline")
        else:
            _watchdog.deadline = deadline
    connection = connections[alias]
    if connection.connection is not None:
        watch(connection.connection, connection_params(connection), pooled=_pooled(connection))
