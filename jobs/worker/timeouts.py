"""Timeouts (J17): at its handler's timeout an attempt's cancellation signal is set,
with ``CancelReason.TIMEOUT`` (an ``async def`` handler is cancelled on its loop);
its lease is no longer renewed. If the handler has not returned
``JOBS["TIMEOUT_GRACE_SECONDS"]`` later, the worker fails the attempt with
``JobTimedOut`` (retried by the handler's policy), frees its slot at once and starts
a fresh thread in its place: the abandoned thread is left to finish, and whatever it
reports later is fenced off by its token (and dropped by the worker).
"""

from __future__ import annotations

import logging
import time

from ledon.engine import FAILED
from ledon.faults import fault_point

from ..attempts import timed_out
from ..types import CancelReason
from .base import Running
from .threads import HandlerThreads

logger = logging.getLogger(__name__)


class Timeouts(HandlerThreads):
    def _enforce_timeouts(self) -> float | None:
        """Signal the handlers past their timeout and abandon those past its grace;
        returns the seconds until the next such moment (None: none is pending)."""
        now = time.monotonic()
        grace = self.settings.TIMEOUT_GRACE_SECONDS
        signal, abandon = [], []
        next_at: float | None = None
        with self._lock:
            for entry in self._running.values():
                if entry.deadline is None or entry.returned:
                    continue
                if not entry.ctx.timed_out:
                    if now >= entry.deadline:
                        signal.append(entry)
                    else:
                        next_at = _earliest(next_at, entry.deadline)
                        continue
                if now >= entry.deadline + grace:
                    entry.abandoned = True  # from here on its thread writes nothing
                    abandon.append(entry)
                else:
                    next_at = _earliest(next_at, entry.deadline + grace)
        for entry in signal:
            self._emit("timed-out", entry.claim, "signalled to stop (timeout)")
            entry.ctx.signal_cancel(CancelReason.TIMEOUT)
        for entry in abandon:
            self._abandon(entry)
        return None if next_at is None else max(next_at - now, 0.0)

    def _abandon(self, entry: Running) -> None:
        """Fail the attempt with ``JobTimedOut`` and give its slot to a fresh thread.
        If the database fails, the next pass tries again (the lease, no longer
        renewed, lets another worker recover it meanwhile)."""
        claim = entry.claim
        assert entry.spec is not None
        end = timed_out(entry.spec, entry.ctx, self.clock(), abandoned=True)
        outcome = self.guarded(
            f"failing timed-out job {claim.job_id}",
            lambda: end.write(claim.token, now=self.clock()),
        )
        if outcome is FAILED:
            with self._lock:
                entry.abandoned = False
                entry.returned = False
            return
        fault_point("jobs.worker.finished", job_id=claim.job_id, outcome=outcome.value)
        logger.warning(
            "job %s ran past its timeout and did not stop; its thread is left to finish",
            claim.job_id,
            extra={"job_id": claim.job_id, "attempt": claim.attempt},
        )
        with self._lock:
            if entry.thread is not None and entry.thread in self._threads:
                self._threads.remove(entry.thread)
        self._release(claim)
        self._record(claim, "failed", outcome, end.detail)
        self._spawn_thread()


def _earliest(current: float | None, candidate: float) -> float:
    return candidate if current is None else min(current, candidate)
