"""A PostgreSQL LISTEN thread that wakes an engine (job worker, outbox dispatcher).

It holds a dedicated autocommit connection: notifications are sent inside the
writing transaction and arrive on commit. If the connection breaks, the engine still
polls meanwhile, and the thread reconnects with the engines' back-off, saying so once
per outage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from django.db import connections

from ledon.backoff import Backoff
from ledon.outage import OutageReporter

logger = logging.getLogger(__name__)


class Listener(threading.Thread):
    """``LISTEN`` on ``channels`` and call ``on_notify(channel, payload)`` for each
    notification, until :meth:`stop`. ``ready`` is set once listening."""

    def __init__(
        self,
        alias: str,
        channels: Sequence[str],
        on_notify: Callable[[str, str], None],
        *,
        name: str = "pg-listener",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._params = connections[alias].get_connection_params()
        self._params.pop("cursor_factory", None)
        self._channels = list(channels)
        self._on_notify = on_notify
        # Not ``_stop``: Thread.join() calls Thread._stop() on Python 3.12.
        self._stop_requested = threading.Event()
        self._backoff = Backoff()
        # The engine reports the database outage itself; this says why wake-ups stop.
        self._outage = OutageReporter(logger, f"{name} connection", level=logging.WARNING)
        self.ready = threading.Event()

    def stop(self) -> None:
        self._stop_requested.set()

    def run(self) -> None:
        # psycopg is the [postgres] extra; only PostgreSQL set-ups start a listener.
        import psycopg
        from psycopg import sql

        while not self._stop_requested.is_set():
            try:
                with psycopg.connect(**self._params, autocommit=True) as conn:
                    for channel in self._channels:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self._backoff.reset()
                    self._outage.recovered()
                    self.ready.set()
                    while not self._stop_requested.is_set():
                        # Short waits: a stopping engine joins this thread.
                        for notify in conn.notifies(timeout=0.1):
                            self._on_notify(notify.channel, notify.payload)
            except psycopg.Error as exc:
                delay = self._backoff.next_delay()
                self._outage.failed(
                    exc, doing="listening (polling meanwhile)", retry_in=self._backoff.ceiling
                )
                self._stop_requested.wait(delay)
