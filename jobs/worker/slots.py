"""The slots: a fixed set of handler threads taking claims from one queue, each
running one attempt at a time (``async def`` handlers run on one event loop, started
on first use), and the LISTEN thread that wakes the main loop on PostgreSQL.

What an attempt's end is — succeeded, failed (retry or not), put back, released
after the shutdown — is decided by :func:`jobs.attempts.run_attempt`, the same
function ``jobs.testing`` uses; a slot only chooses how the end is written: a success
joins the next settle, the rest are written on their own by the finisher.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connections

from ledon.engine import FAILED
from ledon.faults import fault_point
from ledon.pglisten import Listener

from .. import execution
from ..attempts import Ending, run_attempt
from ..handlers import HandlerSpec, JobContext
from ..observability.log_fields import attempt_fields
from ..types import Claim
from .interfaces import WorkerInterface

logger = logging.getLogger("jobs.worker")

#: The reason stored on a claim released before its handler started.
NEVER_STARTED = "released: never started, the worker shut down"
#: The reason stored on a look-ahead claim that waited too long for a slot.
LOOKED_AHEAD_TOO_LONG = "released: waited too long for a slot of its worker"
#: How much each returning handler's run time moves the typical run time (a moving
#: average): one long handler among quick ones is felt at once.
RUN_TIME_WEIGHT = 0.2


class HandlerEnd(enum.Enum):
    """How a slot left an attempt once its handler returned."""

    #: A success, queued for the next settle (which finishes it and frees the slot).
    DEFERRED = "deferred"
    #: Its end was written here (or left to recovery): the slot is free.
    WRITTEN = "written"
    #: The worker abandoned it after its timeout: a fresh thread took this slot.
    ABANDONED = "abandoned"


class SlotIdle(enum.Enum):
    """What a slot does when it has no attempt of its own to run next."""

    #: Wait for the next claim handed over.
    WAIT = "wait"
    #: End the thread: its attempt was abandoned and a fresh thread replaced it.
    RETIRE = "retire"


@dataclass(frozen=True, slots=True)
class RunNext:
    """The slot settled and kept one of the new claims: it runs that one next."""

    claim: Claim


#: What a slot does after one attempt.
AfterAttempt = RunNext | SlotIdle


class Slots:
    """The handler threads, the claims waiting for them, the event loop and the
    LISTEN thread."""

    def __init__(self, worker: WorkerInterface) -> None:
        self._worker = worker
        self._holdings = worker.holdings
        self._tasks: queue.Queue[Claim | None] = queue.Queue()
        self.threads: list[threading.Thread] = []
        self._spawned = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        #: The LISTEN thread (PostgreSQL, ``listen``), once started.
        self.listener: Listener | None = None
        #: A moving average of the handlers' run times (seconds), under the
        #: holdings' lock; None until a handler returned.
        self._typical_run_time: float | None = None

    # ------------------------------------------------------------------ capacity

    def claimable_locked(self, *, finishing: int, reserved: int) -> int:
        """How many jobs a settle may claim now, with the worker's lock held: the
        free slots once ``finishing`` held attempts are finished, plus the
        look-ahead, less what settles under way ``reserved``.

        The look-ahead (``JOBS["PREFETCH"]`` in all, at most) is shared among the
        slots likely to take a job soon — free ones, and those whose handler has run
        less than ``JOBS["PREFETCH_MAX_WAIT"]``: each stands for ``PREFETCH ÷
        concurrency`` jobs of it, rounded up, and no more than the handlers' typical
        run time lets start within ``PREFETCH_MAX_WAIT``. A slot held by a long
        handler stands for none, and handlers that typically run longer than
        ``PREFETCH_MAX_WAIT`` get no look-ahead at all, so that no job waits in this
        worker's memory behind them while another worker could run it (nor is
        claimed only to be given back). Jobs already waiting for a slot count as held.
        """
        held = self._holdings.count_locked() - finishing
        concurrency = self._worker.concurrency
        free = concurrency - held - reserved
        settings = self._worker.settings
        if not settings.PREFETCH:
            return free
        young_since = time.monotonic() - settings.PREFETCH_MAX_WAIT
        young = sum(
            1
            for h in self._holdings.entries_locked()
            if h.started_at is not None and not h.returned and h.started_at >= young_since
        )
        share = -(-settings.PREFETCH // concurrency)
        typical = self._typical_run_time
        if typical is not None and typical > 0:
            share = min(share, int(settings.PREFETCH_MAX_WAIT / typical))
        ready = max(free, 0) + young
        return free + min(settings.PREFETCH, ready * share)

    def hand_back_stale(self) -> float | None:
        """Give back the look-ahead jobs that waited ``JOBS["PREFETCH_MAX_WAIT"]``
        for a slot (their slots' handlers turned out long): released, so that another
        worker can run them. Returns the seconds until the next waiting job would be
        due to go back (None: none waits)."""
        settings = self._worker.settings
        max_wait = settings.PREFETCH_MAX_WAIT
        if not settings.PREFETCH or self._tasks.empty():
            return None
        now = time.monotonic()
        waiting = self.take_waiting()
        stale: list[tuple[Claim, float]] = []
        keep: list[tuple[Claim, float]] = []
        with self._holdings.lock:
            for claim in waiting:
                held = self._holdings.get_locked(claim.token)
                claimed_at = held.claimed_at if held is not None else now
                (stale if now - claimed_at >= max_wait else keep).append((claim, claimed_at))
        self.hand_over(claim for claim, _ in keep)
        for claim, claimed_at in stale:
            detail = "waited too long for a slot"
            if not self.give_back(claim, LOOKED_AHEAD_TOO_LONG, detail, on_main_loop=True):
                self.hand_over([claim])  # the database failed: it waits on, leased
                keep.append((claim, claimed_at))
        if not keep:
            return None
        return max(min(at for _, at in keep) + max_wait - now, 0.0)

    def hand_over(self, claims: Iterable[Claim]) -> None:
        """Queue new claims for the next free slots."""
        for claim in claims:
            self._tasks.put(claim)

    def take_waiting(self) -> list[Claim]:
        """Take back the claims no slot has taken yet (at shutdown, to release them)."""
        taken: list[Claim] = []
        while True:
            try:
                claim = self._tasks.get_nowait()
            except queue.Empty:
                return taken
            if claim is None:
                self._tasks.put(None)  # a thread's stop: leave it for the threads
                return taken
            taken.append(claim)

    def give_back(
        self,
        claim: Claim,
        reason: str = NEVER_STARTED,
        detail: str = "never started: the worker is shutting down",
        *,
        on_main_loop: bool = False,
    ) -> bool:
        """Release a claim whose handler never started: the job is Queued again
        without consuming an attempt; its place is free. True if it was written.

        On a slot's thread the write is retried while the database is unreachable.
        On the main loop (``on_main_loop``) it is one guarded try, so that the loop
        keeps renewing leases during an outage: if it fails the claim stays held
        (the caller hands it over again, or recovery takes it after its lease).
        """
        worker = self._worker
        if on_main_loop:
            outcome = worker.guarded(
                f"releasing job {claim.job_id}",
                lambda: worker.finisher.committed(
                    lambda: execution.release(claim.token, reason, now=worker.clock())
                ),
            )
            if outcome is FAILED:
                return False
            self.release(claim)
            fault_point("jobs.worker.finished", job_id=claim.job_id, outcome=outcome.value)
            worker.finisher.record(claim, "released", outcome, detail)
            return True
        try:
            worker.finisher.finish(
                claim,
                "released",
                lambda: execution.release(claim.token, reason, now=worker.clock()),
                detail,
            )
        except Exception:
            # Its lease is no longer renewed: recovery re-queues it after expiry.
            logger.exception(
                "releasing job %s failed; it will be recovered",
                claim.job_id,
                extra=attempt_fields(claim),
            )
        finally:
            self.release(claim)
        return True

    def release(self, claim: Claim) -> None:
        """The attempt of ``claim`` is no longer held: its slot is free."""
        self._holdings.drop(claim.token)
        self._worker.wake()

    # ------------------------------------------------------------------ threads

    def start(self) -> None:
        for _ in range(self._worker.concurrency):
            self.spawn()
        worker = self._worker
        if worker.listen:
            channel = worker.settings.NOTIFY_CHANNEL
            self.listener = Listener(
                worker.alias,
                [channel, channel + "_cancel"],
                self._notified,
                name="jobs-listener",
                database=worker.settings.LISTEN_DATABASE,
            )
            self.listener.start()

    def stop(self) -> None:
        for _ in self.threads:
            self._tasks.put(None)
        for thread in self.threads:
            thread.join(timeout=1.0)
        if self.listener is not None:
            self.listener.stop()
            # Its connection closes when the thread ends (within one notifies() wait).
            self.listener.join(timeout=2.0)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _notified(self, channel: str, payload: str) -> None:
        worker = self._worker
        if channel.endswith("_cancel"):
            worker.leases.check_soon()
            worker.wake()
        elif not worker.queues or payload in worker.queues:
            worker.wake()

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop ``async def`` handlers run on, started on first use."""
        with self._holdings.lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(
                    target=loop.run_forever, name="jobs-async", daemon=True
                )
                self._loop_thread.start()
                self._loop = loop
            return self._loop

    def spawn(self) -> None:
        """One more handler thread (at start, and in place of an abandoned one)."""
        with self._holdings.lock:
            self._spawned += 1
            name = f"jobs-worker-{self._spawned - 1}"
        thread = threading.Thread(target=self._thread_main, name=name, daemon=True)
        with self._holdings.lock:
            self.threads.append(thread)
        thread.start()

    def retire(self, thread: threading.Thread | None) -> None:
        """Forget ``thread`` (its attempt was abandoned; it ends when its handler does)."""
        with self._holdings.lock:
            if thread is not None and thread in self.threads:
                self.threads.remove(thread)

    def _thread_main(self) -> None:
        try:
            while True:
                claim = self._tasks.get()
                if claim is None:
                    return
                after: AfterAttempt = RunNext(claim)
                while isinstance(after, RunNext):
                    after = self._execute(after.claim)
                if after is SlotIdle.RETIRE:
                    return
        finally:
            connections.close_all()

    # ------------------------------------------------------------------ one attempt

    def _execute(self, claim: Claim) -> AfterAttempt:
        """Run one attempt; then the claim this slot runs next, if it settled."""
        with self._holdings.lock:
            held = self._holdings.get_locked(claim.token)
            assert held is not None
            held.thread = threading.current_thread()
        if self._worker.stopping:
            # Claimed but not started when the worker began to stop: give it back
            # rather than start work the shutdown would then interrupt.
            self.give_back(claim)
            return SlotIdle.WAIT
        end = HandlerEnd.WRITTEN
        try:
            end = self._run_handler(claim, held.ctx)
        except Exception:
            # Never let a slot's thread die: the attempt stays Running, its lease is
            # no longer renewed, and recovery re-queues it after expiry.
            logger.exception(
                "finishing job %s failed; it will be recovered",
                claim.job_id,
                extra=attempt_fields(claim),
            )
        finally:
            if end is HandlerEnd.WRITTEN:
                self.release(claim)
        if end is HandlerEnd.ABANDONED:
            return SlotIdle.RETIRE
        if end is HandlerEnd.DEFERRED:
            next_claim = self._worker.settler.settle_on_this_thread()
            if next_claim is not None:
                return RunNext(next_claim)
        return SlotIdle.WAIT

    def _handler_starting(self, claim: Claim, spec: HandlerSpec) -> None:
        """The handler starts now; its timeout, if any, runs from here."""
        timeout = spec.timeout_seconds()
        now = time.monotonic()
        with self._holdings.lock:
            held = self._holdings.get_locked(claim.token)
            if held is None:
                return
            held.spec = spec
            held.started_at = now
            if timeout is not None:
                held.deadline = now + timeout
        if timeout is not None:
            self._worker.wake()  # the main loop's next wait ends at the deadline

    def _note_run_time_locked(self, seconds: float) -> None:
        typical = self._typical_run_time
        self._typical_run_time = (
            seconds if typical is None else typical + RUN_TIME_WEIGHT * (seconds - typical)
        )

    def _run_handler(self, claim: Claim, ctx: JobContext) -> HandlerEnd:
        """Run the attempt's handler and write (or defer) its end."""
        worker = self._worker
        end = run_attempt(
            ctx,
            clock=worker.clock,
            loop=self.event_loop,
            starting=lambda spec: self._handler_starting(claim, spec),
        )
        with self._holdings.lock:
            held = self._holdings.get_locked(claim.token)
            if held is None or held.abandoned:
                return HandlerEnd.ABANDONED
            held.returned = True
            if held.started_at is not None:
                self._note_run_time_locked(time.monotonic() - held.started_at)
        fault_point(
            "jobs.worker.handler_returned",
            job_id=claim.job_id,
            attempt=claim.attempt,
            ending=end.ending.value,
        )
        if end.ending is Ending.SUCCEEDED and worker.settler.defer_completion(claim, end.result):
            return HandlerEnd.DEFERRED
        worker.finisher.finish(
            claim, end.event, lambda: end.write(claim.token, now=worker.clock()), end.detail
        )
        return HandlerEnd.WRITTEN
