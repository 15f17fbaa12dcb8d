"""The lease keeper: while a driver runs an instance's steps, a thread of its own
renews the instance's lease every ``heartbeat_seconds``.

Renewals keep the version (:func:`sagas.store.renew`), so they never fence the step
under way. When a renewal finds the instance leased to someone else, the keeper
reports the lost lease once (the driver cancels the step) and ends.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime

from django.db import connections

from ledon.db import DATABASE_ERRORS, alias_for, reset_connection

from . import store
from .conf import SagasSettings
from .models import SagaInstance

logger = logging.getLogger(__name__)

#: Reports a database error of a step beside the main loop (the lease keeper).
DatabaseErrorReport = Callable[[str, Exception], object]


class LeaseKeeper(threading.Thread):
    """Renews one instance's lease until stopped; reports a lost lease once."""

    def __init__(
        self,
        instance_id: uuid.UUID,
        owner: str,
        settings: SagasSettings,
        clock: Callable[[], datetime],
        on_lost: Callable[[], None],
        on_database_error: DatabaseErrorReport | None = None,
    ) -> None:
        super().__init__(name=f"saga-lease-{instance_id}", daemon=True)
        self.instance_id = instance_id
        self.owner = owner
        self.settings = settings
        self.clock = clock
        self.on_lost = on_lost
        self.on_database_error = on_database_error
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            while not self._stop_event.wait(self.settings.heartbeat_seconds):
                try:
                    kept = store.renew(
                        self.instance_id,
                        self.owner,
                        lease_seconds=self.settings.LEASE_SECONDS,
                        now=self.clock(),
                    )
                except DATABASE_ERRORS as exc:
                    if self.on_database_error is not None:
                        self.on_database_error("renewing the lease of a saga instance", exc)
                    else:
                        logger.exception(
                            "renewing the lease of saga instance %s failed; will retry",
                            self.instance_id,
                        )
                    reset_connection(alias_for(SagaInstance))
                    continue
                if not kept:
                    if not self._stop_event.is_set():
                        self.on_lost()
                    return
        finally:
            connections.close_all()
