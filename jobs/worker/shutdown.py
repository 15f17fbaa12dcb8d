"""The shutdown sequence: stop claiming, give back the claims no handler started,
give the running handlers ``shutdown_timeout`` seconds, then signal cancellation
inside the process, wait ``cancel_grace`` more seconds, and end whatever still runs.

A handler that returns because of the shutdown signal has its claim released by its
slot (the job Queued again, the attempt not counted): a routine deploy never uses up
a job's attempts. A handler still running after the grace is recovered as a stopped
worker's would be: its attempt Interrupted, the job re-queued without using an
attempt while its interruptions stay below ``JOBS["MAX_INTERRUPTIONS"]`` (the crash
budget). A second stop request signals cancellation at once; a third stops waiting.
"""

from __future__ import annotations

import logging
import threading
import time

from ledon.db import DATABASE_ERRORS
from ledon.engine import StopLevel

from .. import execution
from .interfaces import WorkerInterface
from .slots import NEVER_STARTED

logger = logging.getLogger("jobs.worker")

#: The reason stored on an attempt whose handler outlived the shutdown's grace.
OUTLIVED = "worker shut down before the handler stopped"


class ShutdownSequence:
    """What the worker does between a stop request and the end of ``run()``."""

    def __init__(self, worker: WorkerInterface) -> None:
        self._worker = worker

    def run(self) -> None:
        worker = self._worker
        self._give_back_waiting()
        if not worker.busy():
            worker.settler.close()
            return
        worker.emit("shutdown", None, f"waiting up to {worker.shutdown_timeout}s for handlers")
        if not self._wait_for_handlers(worker.shutdown_timeout, until=worker.cancelling_event):
            # Time is up (or a second stop request came): cancellation, at once.
            worker.escalate(StopLevel.CANCEL)
            self._wait_for_handlers(worker.cancel_grace, until=worker.aborting_event)
        worker.settler.close()
        self._give_back_waiting()
        self._end_leftovers()

    def _give_back_waiting(self) -> None:
        """Release the claims still waiting for a slot: no handler started them."""
        slots = self._worker.slots
        for claim in slots.take_waiting():
            # If the database is down it stays held: recovered with what still runs.
            slots.give_back(claim, on_main_loop=True)

    def _end_leftovers(self) -> None:
        """End what is still held once the waiting is over: a success whose finish
        failed on the database is completed; a handler still running is recovered."""
        worker = self._worker
        leftovers = worker.holdings.entries()
        completed = worker.settler.completions()
        for held in leftovers:
            token = held.claim.token
            try:
                if token in completed:
                    # Its handler returned, but the database failed when it was finished.
                    outcome = execution.complete(token, completed[token], now=worker.clock())
                    worker.finisher.record(held.claim, "succeeded", outcome)
                    continue
                if held.thread is None:
                    # No slot ever took it: given back, its attempt unused.
                    outcome = execution.release(token, NEVER_STARTED, now=worker.clock())
                    worker.finisher.record(held.claim, "released", outcome, "never started")
                    continue
                outcome = execution.recover(
                    token, requeue=True, reason=OUTLIVED, now=worker.clock()
                )
            except DATABASE_ERRORS as exc:
                worker.database_failed("ending attempts at shutdown", exc)
                logger.warning(
                    "%d attempt(s) could not be finished or re-queued at shutdown; they are "
                    "recovered when their lease expires",
                    len(leftovers),
                    extra={"worker": worker.worker_id},
                )
                return
            worker.finisher.record(held.claim, "requeued", outcome, "handler did not stop in time")

    def _wait_for_handlers(self, seconds: float, *, until: threading.Event) -> bool:
        """Wait until no handler runs, renewing leases meanwhile; True if none runs,
        False when ``seconds`` passed or ``until`` was set first."""
        worker = self._worker
        deadline = time.monotonic() + seconds
        next_heartbeat = time.monotonic() + worker.settings.HEARTBEAT_SECONDS
        while worker.busy():
            if not worker.backing_off:
                worker.settler.settle(claim=False)
            worker.timeouts.enforce()
            now = time.monotonic()
            if now >= deadline or until.is_set():
                return False
            if now >= next_heartbeat:
                worker.leases.heartbeat()
                next_heartbeat = now + worker.settings.HEARTBEAT_SECONDS
            worker.clear_wake()
            idle = not worker.settler.has_completions()
            if (idle or worker.backing_off) and worker.busy():
                worker.pause(min(deadline - now, next_heartbeat - now, 0.5), until=until)
        return True
