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
import time

from django.db import connections

from ledon.faults import fault_point
from ledon.pglisten import Listener

from ..attempts import Ending, run_attempt
from ..handlers import HandlerSpec, JobContext
from ..observability.log_fields import attempt_fields
from ..types import Claim
from .settling import Settling

logger = logging.getLogger(__name__)


#: What :meth:`HandlerThreads._execute` returns to a thread whose handler outlived its
#: timeout: the thread ends once the handler returns (a fresh one took its place).
_RETIRE = object()


class HandlerThreads(Settling):
    def _start_threads(self) -> None:
        for _ in range(self.concurrency):
            self._spawn_thread()
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

    def _spawn_thread(self) -> None:
        """One more handler thread (at start, and in place of an abandoned one)."""
        with self._lock:
            self._spawned += 1
            name = f"jobs-worker-{self._spawned - 1}"
        thread = threading.Thread(target=self._thread_main, name=name, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _thread_main(self) -> None:
        try:
            while True:
                claim = self._tasks.get()
                if claim is None:
                    return
                next_claim: Claim | object | None = claim
                while isinstance(next_claim, Claim):
                    next_claim = self._execute(next_claim)
                if next_claim is _RETIRE:
                    return
        finally:
            connections.close_all()

    def _execute(self, claim: Claim) -> Claim | object | None:
        """Run one attempt; returns the next claim this thread runs, if it settled,
        or :data:`_RETIRE` if the attempt was abandoned (J17) meanwhile."""
        with self._lock:
            entry = self._running[claim.token]
            entry.thread = threading.current_thread()
        handed_over = False
        retire = False
        try:
            handed_over, retire = self._run_handler(claim, entry.ctx)
        except Exception:
            # Never let a worker thread die: the attempt stays Running, its lease
            # is no longer renewed, and recovery re-queues it after expiry.
            logger.exception(
                "finishing job %s failed; it will be recovered",
                claim.job_id,
                extra=attempt_fields(claim),
            )
        finally:
            if not handed_over and not retire:
                self._release(claim)
        if retire:
            return _RETIRE
        return self._settle_on_this_thread() if handed_over else None

    def _handler_starting(self, claim: Claim, spec: HandlerSpec) -> None:
        """J17: the handler starts now; its timeout, if any, runs from here."""
        timeout = spec.timeout_seconds()
        with self._lock:
            entry = self._running.get(claim.token)
            if entry is None:
                return
            entry.spec = spec
            if timeout is not None:
                entry.deadline = time.monotonic() + timeout
        if timeout is not None:
            self._wake.set()  # the main loop's next wait ends at the deadline

    def _run_handler(self, claim: Claim, ctx: JobContext) -> tuple[bool, bool]:
        """Run the attempt's handler and write its end. Returns whether a successful
        attempt was handed to the next settle (which finishes and releases it), and
        whether the attempt was abandoned after its timeout (nothing to write)."""
        end = run_attempt(
            ctx,
            clock=self.clock,
            loop=self._event_loop,
            starting=lambda spec: self._handler_starting(claim, spec),
        )
        with self._lock:
            entry = self._running.get(claim.token)
            if entry is None or entry.abandoned:
                return False, True
            entry.returned = True
        fault_point(
            "jobs.worker.handler_returned",
            job_id=claim.job_id,
            attempt=claim.attempt,
            ending=end.ending.value,
        )
        if end.ending is Ending.SUCCEEDED and self._defer_completion(claim, end.result):
            return True, False
        self._finish(claim, end.event, lambda: end.write(claim.token, now=self.clock()), end.detail)
        return False, False
