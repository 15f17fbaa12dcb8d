"""A PostgreSQL LISTEN thread that wakes an engine (job worker, outbox dispatcher).

It holds a dedicated autocommit connection: notifications are sent inside the
writing transaction and arrive on commit. If the connection breaks, the engine still
polls meanwhile, and the thread reconnects. This module imports no models, so any
app may use it whether or not the outbox app is installed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from django.db import connections

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
        self._stop = threading.Event()
        self.ready = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        import psycopg
        from psycopg import sql

        while not self._stop.is_set():
            try:
                with psycopg.connect(**self._params, autocommit=True) as conn:
                    for channel in self._channels:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.ready.set()
                    while not self._stop.is_set():
                        for notify in conn.notifies(timeout=0.5):
                            self._on_notify(notify.channel, notify.payload)
            except psycopg.Error as exc:
                logger.warning("%s connection failed, polling meanwhile: %s", self.name, exc)
                self._stop.wait(1.0)
