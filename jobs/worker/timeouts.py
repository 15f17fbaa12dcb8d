"""The timeout watch: at its handler's timeout an attempt's cancellation signal is
set, with ``CancelReason.TIMEOUT`` (an ``async def`` handler is cancelled on its
loop); its lease is no longer renewed. If the handler has not returned
``JOBS["TIMEOUT_GRACE_SECONDS"]`` later, the worker fails the attempt with
``JobTimedOut`` (retried by the handler's policy), frees its slot at once and starts
a fresh thread in its place: the abandoned thread is left to finish, and whatever it
reports later is fenced off by its token (and dropped by the worker). An ``async def``
handler holds no thread: it was cancelled on its loop at the timeout, and whatever it
still does is dropped the same way.
"""

from __future__ import annotations

import logging
import time

from ledon.engine import FAILED
from ledon.faults import fault_point

from ..attempts import timed_out
from ..types import CancelReason
from .holdings import HeldAttempt
from .interfaces import WorkerInterface

logger = logging.getLogger("jobs.worker")


class TimeoutWatch:
    """Signals handlers past their timeout and abandons those past its grace."""

    def __init__(self, worker: WorkerInterface) -> None:
        self._worker = worker
        self._holdings = worker.holdings

    def enforce(self) -> float | None:
        """Signal the handlers past their timeout and abandon those past its grace;
        returns the seconds until the next such moment (None: none is pending)."""
        now = time.monotonic()
        grace = self._worker.settings.TIMEOUT_GRACE_SECONDS
        signal, abandon = [], []
        next_at: float | None = None
        with self._holdings.lock:
            for held in self._holdings.entries_locked():
                if held.deadline is None or held.returned:
                    continue
                if not held.ctx.timed_out:
                    if now >= held.deadline:
                        signal.append(held)
                    else:
                        next_at = _earliest(next_at, held.deadline)
                        continue
                if now >= held.deadline + grace:
                    held.abandoned = True  # from here on its thread writes nothing
                    abandon.append(held)
                else:
                    next_at = _earliest(next_at, held.deadline + grace)
        for held in signal:
            self._worker.emit("timed-out", held.claim, "signalled to stop (timeout)")
            held.ctx.signal_cancel(CancelReason.TIMEOUT)
        for held in abandon:
            self._abandon(held)
        return None if next_at is None else max(next_at - now, 0.0)

    def _abandon(self, held: HeldAttempt) -> None:
        """Fail the attempt with ``JobTimedOut`` and give its slot to a fresh thread.
        If the database fails, the next pass tries again (the lease, no longer
        renewed, lets another worker recover it meanwhile)."""
        worker = self._worker
        claim = held.claim
        assert held.spec is not None
        end = timed_out(held.spec, held.ctx, worker.clock(), abandoned=True)
        outcome = worker.guarded(
            f"failing timed-out job {claim.job_id}",
            lambda: end.write(claim.token, now=worker.clock()),
        )
        if outcome is FAILED:
            with self._holdings.lock:
                held.abandoned = False
                held.returned = False
            return
        fault_point("jobs.worker.finished", job_id=claim.job_id, outcome=outcome.value)
        logger.warning(
            "job %s ran past its timeout and did not stop; its thread is left to finish",
            claim.job_id,
            extra={"job_id": claim.job_id, "attempt": claim.attempt},
        )
        worker.slots.handler_stopped(held)
        worker.slots.release(claim)
        worker.finisher.record(claim, "failed", outcome, end.detail)
        if not held.on_loop:  # a coroutine, cancelled on its loop, holds no thread
            worker.slots.retire(held.thread)
            worker.slots.spawn()


def _earliest(current: float | None, candidate: float) -> float:
    return candidate if current is None else min(current, candidate)
