"""The worker's graceful shutdown (J14): stop claiming, give the running handlers
``shutdown_timeout`` seconds, then signal cancellation inside the process, wait
``cancel_grace`` more seconds, and recover and re-queue whatever still runs (J11).
A second stop request signals cancellation at once; a third stops waiting.
"""

from __future__ import annotations

import logging
import threading
import time

from ledon.db import DATABASE_ERRORS
from ledon.engine import StopLevel

from .. import execution
from ..signals import finished_attempt
from .timeouts import Timeouts

logger = logging.getLogger(__name__)


class Shutdown(Timeouts):
    def _shutdown(self) -> None:
        if not self._busy():
            self._close_settling()
            return
        self._emit("shutdown", None, f"waiting up to {self.shutdown_timeout}s for handlers")
        if not self._wait_for_handlers(self.shutdown_timeout, until=self._cancelling):
            # Time is up (or a second stop request came): cancellation, at once.
            self.escalate(StopLevel.CANCEL)
            self._wait_for_handlers(self.cancel_grace, until=self._aborting)
        self._close_settling()
        with self._lock:
            leftovers = list(self._running.values())
            completed = {claim.token: result for claim, result in self._completed}
        for entry in leftovers:
            token = entry.claim.token
            try:
                if token in completed:
                    # Its handler returned, but the database failed when it was finished.
                    outcome = execution.complete(token, completed[token], now=self.clock())
                    self._record(entry.claim, "succeeded", outcome)
                    continue
                outcome = execution.recover(
                    token,
                    requeue=True,
                    reason="worker shut down before the handler stopped",
                    now=self.clock(),
                )
            except DATABASE_ERRORS as exc:
                self.database_failed("re-queueing attempts at shutdown", exc)
                logger.warning(
                    "%d attempt(s) could not be finished or re-queued at shutdown; they are "
                    "recovered when their lease expires",
                    len(leftovers),
                    extra={"worker": self.worker_id},
                )
                return
            self.stats.count(outcome)
            finished_attempt(entry.claim, outcome, retry_scheduled=False)
            self._emit("requeued", entry.claim, "handler did not stop in time")

    def _wait_for_handlers(self, seconds: float, *, until: threading.Event) -> bool:
        """Wait until no handler runs, renewing leases meanwhile; True if none runs,
        False when ``seconds`` passed or ``until`` was set first."""
        deadline = time.monotonic() + seconds
        next_heartbeat = time.monotonic() + self.settings.HEARTBEAT_SECONDS
        while self._busy():
            if not self.backing_off:
                self._settle(claim=False)
            self._enforce_timeouts()
            now = time.monotonic()
            if now >= deadline or until.is_set():
                return False
            if now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + self.settings.HEARTBEAT_SECONDS
            self._wake.clear()
            with self._lock:
                idle = not self._completed
            if (idle or self.backing_off) and self._busy():
                self.pause(min(deadline - now, next_heartbeat - now, 0.5), until=until)
        return True
