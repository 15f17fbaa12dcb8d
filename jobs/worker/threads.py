"""The worker's handler threads and its event loop: a fixed set of threads takes
claims from a queue and runs one attempt at a time (``async def`` handlers run on one
event loop, started on first use); the LISTEN thread wakes the main loop on
PostgreSQL.

What an attempt's end is — succeeded, failed (retry or not), put back (J19),
re-queued after the shutdown — is decided by :func:`jobs.attempts.run_attempt`, the
same function ``jobs.testing`` uses; a thread only chooses how the end is written: a
success joins the next settle, the rest are finished on their own.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from django.db import connections

from ledon.faults import fault_point
from ledon.pglisten import Listener

from ..attempts import Ending, run_attempt
from ..handlers import JobContext
from ..log_fields import attempt_fields
from ..types import Claim
from .settling import Settling

logger = logging.getLogger(__name__)


class HandlerThreads(Settling):
    def _start_threads(self) -> None:
        for index in range(self.concurrency):
            thread = threading.Thread(
                target=self._thread_main, name=f"jobs-worker-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        if self.listen:
            channel = self.settings.NOTIFY_CHANNEL
            self._listener = Listener(
                self.alias,
                [channel, channel + "_cancel"],
                self._notified,
                name="jobs-listener",
                database=self.settings.LISTEN_DATABASE,
            )
            self._listener.start()

    def _stop_threads(self) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join(timeout=1.0)
        if self._listener is not None:
            self._listener.stop()
            # Its connection closes when the thread ends (within one notifies() wait).
            self._listener.join(timeout=2.0)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _notified(self, channel: str, payload: str) -> None:
        if channel.endswith("_cancel"):
            self._check_cancel_now.set()
            self._wake.set()
        elif not self.queues or payload in self.queues:
            self._wake.set()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(
                    target=loop.run_forever, name="jobs-async", daemon=True
                )
                self._loop_thread.start()
                self._loop = loop
            return self._loop

    def _thread_main(self) -> None:
        try:
            while True:
                claim = self._tasks.get()
                if claim is None:
                    return
                while claim is not None:
                    claim = self._execute(claim)
        finally:
            connections.close_all()

    def _execute(self, claim: Claim) -> Claim | None:
        """Run one attempt; returns the next claim this thread runs, if it settled."""
        with self._lock:
            entry = self._running[claim.token]
        handed_over = False
        try:
            handed_over = self._run_handler(claim, entry.ctx)
        except Exception:
            # Never let a worker thread die: the attempt stays Running, its lease
            # is no longer renewed, and recovery re-queues it after expiry.
            logger.exception(
                "finishing job %s failed; it will be recovered",
                claim.job_id,
                extra=attempt_fields(claim),
            )
        finally:
            if not handed_over:
                self._release(claim)
        return self._settle_on_this_thread() if handed_over else None

    def _run_handler(self, claim: Claim, ctx: JobContext) -> bool:
        """Run the attempt's handler and write its end; True if a successful attempt
        was handed to the next settle, which finishes and releases it."""
        end = run_attempt(ctx, clock=self.clock, loop=self._event_loop)
        fault_point(
            "jobs.worker.handler_returned",
            job_id=claim.job_id,
            attempt=claim.attempt,
            ending=end.ending.value,
        )
        if end.ending is Ending.SUCCEEDED and self._defer_completion(claim, end.result):
            return True
        self._finish(claim, end.event, lambda: end.write(claim.token, now=self.clock()), end.detail)
        return False
