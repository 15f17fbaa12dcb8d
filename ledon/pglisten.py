"""A PostgreSQL LISTEN thread that wakes an engine (job worker, outbox dispatcher).

It holds a dedicated autocommit connection: notifications are sent inside the
writing transaction and arrive on commit. If the connection breaks, the engine still
polls meanwhile, and the thread reconnects with the engines' back-off, saying so once
per outage. A connection that goes silent breaks nothing by itself, so after a quiet
spell the thread sends a round trip, which the round-trip watchdog
(:mod:`ledon.deadline`) breaks if no reply comes.

Behind a transaction-pooling PgBouncer a LISTEN cannot work: the pooler hands the
server connection to other clients after each statement, so notifications reach
whichever client holds it next, or nobody. An engine then LISTENs on the alias its
app's ``LISTEN_DATABASE`` setting names (a direct connection to the same database);
when the alias it would use is a pooled one — ``DISABLE_SERVER_SIDE_CURSORS``, which
Django requires behind such a pooler, is the one sign a configuration gives — it does
not LISTEN at all and only polls, which the system checks (``jobs.W001``,
``outbox.W003``) say.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Sequence

from django.core import checks
from django.db import connections

from ledon.backoff import Backoff
from ledon.deadline import (
    DEFAULT_DEADLINE,
    apply_connection_defaults,
    configured_deadline,
    connection_params,
    watch,
)
from ledon.outage import OutageReporter

logger = logging.getLogger(__name__)


def is_pooled(alias: str) -> bool:
    """Whether ``DATABASES[alias]`` goes through a transaction pooler, as far as the
    configuration says: Django's ``DISABLE_SERVER_SIDE_CURSORS``, which such a pooler
    requires. (Nothing else in a configuration tells a pooler from a server.)"""
    return bool(connections[alias].settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"))


def listen_alias(alias: str, database: str | None) -> str | None:
    """The alias whose connection LISTENs for an engine on ``alias``: ``database``
    (the app's ``LISTEN_DATABASE``) if set, else ``alias``; None when that one goes
    through a transaction pooler, where the engine only polls."""
    chosen = database or alias
    return None if is_pooled(chosen) else chosen


def check_listen_database(
    setting: str, alias: str, database: str | None, *, warning_id: str, error_id: str
) -> list[checks.CheckMessage]:
    """For an engine on the PostgreSQL ``alias``: a warning (``warning_id``) when it
    would only poll because its LISTEN connection goes through a pooler, an error
    (``error_id``) when ``database`` is not PostgreSQL. ``setting`` names the app's
    ``LISTEN_DATABASE`` setting, e.g. ``JOBS['LISTEN_DATABASE']``."""
    if connections[alias].vendor != "postgresql":
        return []  # SQLite polls anyway
    if database is not None and connections[database].vendor != "postgresql":
        return [
            checks.Error(
                f"{setting} is {database!r}, which is not a PostgreSQL database: "
                "LISTEN needs a direct connection to the same PostgreSQL database",
                hint=f"Point {setting} at a DATABASES entry for the same database that "
                "bypasses the pooler, or remove it.",
                id=error_id,
            )
        ]
    if listen_alias(alias, database) is not None:
        return []
    return [
        checks.Warning(
            f"{setting} is {database or alias!r}, which goes through a transaction "
            "pooler (DISABLE_SERVER_SIDE_CURSORS is set): LISTEN cannot work there, so "
            "the engines poll for new work (every POLL_INTERVAL) instead of being woken",
            hint=f"Add a DATABASES entry for the same database that connects to "
            f"PostgreSQL directly (it holds one connection per engine) and set "
            f"{setting} to its alias; or keep polling.",
            id=warning_id,
        )
    ]


class Listener(threading.Thread):
    """``LISTEN`` on ``channels`` and call ``on_notify(channel, payload)`` for each
    notification, until :meth:`stop`. ``ready`` is set once listening.

    The connection is ``database``'s (an app's ``LISTEN_DATABASE``), else ``alias``'s;
    if that one is pooled (:func:`listen_alias`) the thread ends at once and the
    engine polls."""

    def __init__(
        self,
        alias: str,
        channels: Sequence[str],
        on_notify: Callable[[str, str], None],
        *,
        name: str = "pg-listener",
        database: str | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        #: The alias whose connection LISTENs; None: pooled, so the engine only polls.
        self.alias = listen_alias(alias, database)
        if self.alias is not None:
            # A LISTEN_DATABASE alias gets the engines' connection options too.
            apply_connection_defaults(self.alias, configured_deadline())
        self._params = {} if self.alias is None else connection_params(connections[self.alias])
        self._channels = list(channels)
        self._on_notify = on_notify
        # Not ``_stop``: Thread.join() calls Thread._stop() on Python 3.12.
        self._stop_requested = threading.Event()
        # Written to by stop(): the thread's wait for notifications ends at once.
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._pipe_lock = threading.Lock()
        self._pipe_open = True
        self._backoff = Backoff()
        # The engine reports the database outage itself; this says why wake-ups stop.
        self._outage = OutageReporter(logger, f"{name} connection", level=logging.WARNING)
        self.ready = threading.Event()
        #: Seconds without a notification after which the thread checks that its
        #: connection still answers.
        self.ping_interval = configured_deadline() or DEFAULT_DEADLINE

    def stop(self) -> None:
        self._stop_requested.set()
        with self._pipe_lock:
            if self._pipe_open:
                with contextlib.suppress(BlockingIOError):  # a wake-up is pending already
                    os.write(self._wake_write, b"\0")

    def _close_pipe(self) -> None:
        with self._pipe_lock:
            if self._pipe_open:
                self._pipe_open = False
                os.close(self._wake_write)
                os.close(self._wake_read)

    def run(self) -> None:
        try:
            self._listen()
        finally:
            self._close_pipe()

    def _listen(self) -> None:
        # psycopg is the [postgres] extra; only PostgreSQL set-ups start a listener.
        import psycopg
        from psycopg import sql

        if self.alias is None:
            logger.info("%s: the database is pooled, so no LISTEN: polling only", self.name)
            return
        while not self._stop_requested.is_set():
            try:
                with psycopg.connect(**self._params, autocommit=True) as conn:
                    watch(conn, self._params)
                    for channel in self._channels:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self._backoff.reset()
                    self._outage.recovered()
                    self.ready.set()
                    quiet_since = time.monotonic()
                    while not self._stop_requested.is_set():
                        # What arrived (or came with the last round trip), then a
                        # wait on the socket and on stop()'s pipe: no polling, and
                        # a stopping engine's join returns at once.
                        for notify in conn.notifies(timeout=0):
                            quiet_since = time.monotonic()
                            self._on_notify(notify.channel, notify.payload)
                        left = self.ping_interval - (time.monotonic() - quiet_since)
                        if left > 0:
                            select.select([conn.fileno(), self._wake_read], [], [], left)
                        if time.monotonic() - quiet_since >= self.ping_interval:
                            # A connection that went silent delivers no notification
                            # and no error either: a round trip finds out (the
                            # watchdog breaks it if no reply comes).
                            conn.execute("SELECT 1")
                            quiet_since = time.monotonic()
            except psycopg.Error as exc:
                delay = self._backoff.next_delay()
                self._outage.failed(
                    exc, doing="listening (polling meanwhile)", retry_in=self._backoff.ceiling
                )
                self._stop_requested.wait(delay)
