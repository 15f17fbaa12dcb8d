"""The slots: handler threads taking claims from one work queue, each running one
plain handler at a time, the event loop that runs every ``async def`` handler (started
on first use), and the LISTEN thread that wakes the main loop on PostgreSQL.

The worker's concurrency is what it holds, not its threads: a thread starts an
``async def`` handler on the loop and goes back to the queue at once, and the
coroutine's end comes back through the queue for a thread to write
(:class:`~jobs.worker.workqueue.LoopEnd`). Threads start when work waits and no
thread is free, up to the concurrency: an ``async def`` handler at concurrency 64
runs on a few threads, a plain one on as many threads as run at once.

What an attempt's end is — succeeded, failed (retry or not), put back, released
after the shutdown — is decided by :func:`jobs.attempts.attempt_ended`, the policy
``jobs.testing`` uses too, for plain handlers and coroutines alike; a slot only
chooses how the end is written: a success joins the next settle, the rest are
written on their own by the finisher.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connections

from ledon.db import drop_closed_connections
from ledon.engine import FAILED
from ledon.faults import fault_point
from ledon.pglisten import Listener

from .. import execution
from ..attempts import AttemptEnd, Ending, attempt_ended, begin_attempt
from ..handlers import HandlerSpec
from ..middleware import chain_for
from ..observability.log_fields import attempt_fields
from ..types import CancelReason, Claim
from .holdings import HeldAttempt
from .interfaces import Deferral, WorkerInterface
from .workqueue import SETTLE_HERE, STOP, LoopEnd, SettleHere, Stop, WorkQueue

logger = logging.getLogger("jobs.worker")

#: The reason stored on a claim released before its handler started.
NEVER_STARTED = "released: never started, the worker shut down"
#: The reason stored on a look-ahead claim that waited too long for a slot.
LOOKED_AHEAD_TOO_LONG = "released: waited too long for a slot of its worker"
#: How much each returning handler's run time moves the typical run time (a moving
#: average), and each settle's round trip the typical one: one long handler among
#: quick ones is felt at once.
RUN_TIME_WEIGHT = 0.2
#: The look-ahead a worker chooses (``JOBS["PREFETCH"]`` None) for handlers that
#: are not quick, where no flow limit applies to its queues: at concurrency 16 a 5 ms
#: handler with durable commits needs about three jobs a slot (two settles' round
#: trips of 7-8 ms at 5.5 ms a job); 16 ran dry before each settle committed. The
#: round trips bound it at fewer slots.
AUTO_PREFETCH = 64
#: The look-ahead a worker chooses where a flow limit applies to its queues (a
#: queue's or a handler's): the jobs claimed ahead, and the successes waiting for the
#: next settle, are Running and hold the limits' places — at 64 a burn-down with
#: ``max_running = 64`` reached its limit, and its claims slowed fivefold. And for
#: quick handlers (:data:`QUICK_JOBS_PER_SLOT`).
AUTO_PREFETCH_SMALL = 16
#: Handlers are quick when a slot typically runs more than this many of them during
#: two settles' round trips: no look-ahead hides the commit from them (they finish
#: a batch before the next one comes), and a worker batches them instead — its last
#: slot to return settles the batch and runs a new claim itself, with no other
#: thread to wait for. Measured with no-op handlers at concurrency 16, 64 ahead made
#: the main loop settle 36 jobs at a time beside the busy slots, slower than 16.
QUICK_JOBS_PER_SLOT = 8


def _moved(typical: float | None, seconds: float) -> float:
    """The moving average ``typical`` after one more measure, ``seconds``."""
    return seconds if typical is None else typical + RUN_TIME_WEIGHT * (seconds - typical)


class HandlerEnd(enum.Enum):
    """How a slot left an attempt once its handler returned."""

    #: A success, queued for the next settle (which finishes it and frees the slot).
    DEFERRED = "deferred"
    #: Its end was written here (or left to recovery): the slot is free.
    WRITTEN = "written"
    #: The worker abandoned it after its timeout: a fresh thread took this slot.
    ABANDONED = "abandoned"
    #: An ``async def`` handler now running on the event loop: its end comes back
    #: through the work queue; the thread is free.
    ON_LOOP = "on-loop"


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
        self._work = WorkQueue(worker.concurrency)
        self.threads: list[threading.Thread] = []
        self._spawned = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        #: ``async def`` handlers waiting to start on the loop, and whether the loop
        #: was told to start them.
        self._starts: list[Callable[[asyncio.AbstractEventLoop], None]] = []
        self._starts_due = False
        self._starts_lock = threading.Lock()
        self._loop_thread: threading.Thread | None = None
        #: The LISTEN thread (PostgreSQL, ``listen``), once started.
        self.listener: Listener | None = None
        #: A moving average of the handlers' run times (seconds), under the
        #: holdings' lock; None until a handler returned.
        self._typical_run_time: float | None = None
        #: A moving average of the settles' round trips (seconds, from a settle's
        #: start to its claims handed over), under the holdings' lock; None until a
        #: settle claimed.
        self._typical_round_trip: float | None = None
        #: The look-ahead, once known (:meth:`look_ahead`), and whether the worker
        #: chose it and may take less for quick handlers.
        self._look_ahead: int | None = None
        self._chosen = False

    # ------------------------------------------------------------------ capacity

    def look_ahead(self) -> int:
        """The look-ahead at most: ``JOBS["PREFETCH"]``, or where it is None
        :data:`AUTO_PREFETCH` — :data:`AUTO_PREFETCH_SMALL` where a flow limit
        applies to the worker's queues (read once the worker runs, its handlers and
        their limits registered)."""
        if self._look_ahead is None:
            configured = self._worker.settings.PREFETCH
            if configured is None:
                limited = bool(execution.claim_limits().for_queues(self._worker.queues))
                configured = AUTO_PREFETCH_SMALL if limited else AUTO_PREFETCH
                self._chosen = not limited
            self._look_ahead = configured
        return self._look_ahead

    def claimable_locked(self, *, reserved: int) -> int:
        """How many jobs a settle may claim now, with the worker's lock held: a job
        for each free slot and the look-ahead's places not taken, less what settles
        under way ``reserved``.

        A slot is free once its handler returned: an attempt that returned and waits
        for its finish's commit (in this settle or the next) holds neither a slot nor
        a place in the look-ahead. Counted as held, the successes waiting for the
        next settle — at a 5 ms handler about as many as return during one commit —
        took the look-ahead's places, and a returning slot found no job waiting.

        The look-ahead (:meth:`look_ahead` in all, at most, besides a job for each
        free slot) is shared among the slots likely to take a job soon — free ones,
        and those whose handler has run less than ``JOBS["PREFETCH_MAX_WAIT"]``: each
        stands for ``PREFETCH ÷ concurrency`` jobs of it, rounded up, and no more than
        it starts while its next claim is on its way — the settle under way and the
        next one, two of the settles' typical round trips, at the handlers' typical
        run time — nor than that run time lets start within ``PREFETCH_MAX_WAIT``. A
        slot held by a long handler stands for none, and handlers that typically run
        longer than ``PREFETCH_MAX_WAIT`` get no look-ahead at all, so that no job
        waits in this worker's memory behind them while another worker could run it
        (nor is claimed only to be given back). Jobs already waiting for a slot take
        their places first. Where the worker chose its look-ahead, quick handlers
        (:data:`QUICK_JOBS_PER_SLOT`) get the smaller one.
        """
        settings = self._worker.settings
        prefetch = self.look_ahead()
        young_since = time.monotonic() - settings.PREFETCH_MAX_WAIT
        running = waiting = young = 0
        for h in self._holdings.entries_locked():
            if h.returned:
                continue
            if h.started_at is None and not h.running:
                waiting += 1
                continue
            running += 1
            if h.started_at is not None and h.started_at >= young_since:
                young += 1
        concurrency = self._worker.concurrency
        free = max(concurrency - running, 0)
        if not prefetch:
            return free - waiting - reserved
        typical, round_trip = self._typical_run_time, self._typical_round_trip
        during = None  # jobs a slot runs during two round trips
        if typical is not None and typical > 0 and round_trip is not None:
            during = math.ceil(2 * round_trip / typical)
            if self._chosen and during > QUICK_JOBS_PER_SLOT:
                prefetch = AUTO_PREFETCH_SMALL  # quick handlers: batched instead
        share = -(-prefetch // concurrency)
        if typical is not None and typical > 0:
            share = min(share, int(settings.PREFETCH_MAX_WAIT / typical))
        if during is not None:
            share = min(share, during)
        return free + min(prefetch, (free + young) * share) - waiting - reserved

    def note_round_trip_locked(self, seconds: float) -> None:
        """A settle's claims were handed over ``seconds`` after it started (called
        with the worker's lock held)."""
        self._typical_round_trip = _moved(self._typical_round_trip, seconds)

    def hand_back_stale(self) -> float | None:
        """Give back the look-ahead jobs that waited ``JOBS["PREFETCH_MAX_WAIT"]``
        for a slot (their slots' handlers turned out long): released, so that another
        worker can run them. Returns the seconds until the next waiting job would be
        due to go back (None: none waits)."""
        settings = self._worker.settings
        max_wait = settings.PREFETCH_MAX_WAIT
        if not self.look_ahead() or not self._work.has_claims():
            return None
        now = time.monotonic()
        # The claims stay queued while they are looked at: emptied and filled again
        # at every pass of the main loop, the queue made the slots that came for their
        # next job meanwhile wait, to be woken one by one.
        stale: list[tuple[Claim, float]] = []
        kept: list[float] = []
        waiting = self._work.claims()
        with self._holdings.lock:
            for claim in waiting:
                held = self._holdings.get_locked(claim.token)
                claimed_at = held.claimed_at if held is not None else now
                if now - claimed_at >= max_wait:
                    stale.append((claim, claimed_at))
                else:
                    kept.append(claimed_at)
        claimed_at_of = {claim.token: at for claim, at in stale}
        for claim in self._work.take([claim for claim, _ in stale]):
            detail = "waited too long for a slot"
            if not self.give_back(claim, LOOKED_AHEAD_TOO_LONG, detail, on_main_loop=True):
                self.hand_over([claim])  # the database failed: it waits on, leased
                kept.append(claimed_at_of[claim.token])
        if not kept:
            return None
        return max(min(kept) + max_wait - now, 0.0)

    def hand_over(self, claims: Iterable[Claim]) -> None:
        """Queue new claims for the next free slots."""
        self._start_threads(self._work.put_many(claims))

    def take_waiting(self) -> list[Claim]:
        """Take back the claims no slot has taken yet (at shutdown, to release them)."""
        return self._work.take_claims()

    def _start_threads(self, unserved: int) -> None:
        """Start one more thread if work that may start now waits and no thread is
        free, never more than the concurrency. Called when work is queued and when a
        thread is about to run a plain handler (which holds it until it returns):
        an ``async def`` handler, which frees its thread at once, starts none."""
        if unserved:
            self.spawn(limit=self._worker.concurrency)

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
        self._worker.attempts_ended()
        self._worker.wake()
        fault_point("jobs.worker.done_with", job_id=claim.job_id)

    # ------------------------------------------------------------------ threads

    def start(self) -> None:
        self.spawn()  # the others start when work waits and no thread is free
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
        with self._holdings.lock:
            threads = list(self.threads)
        self._work.put_many([STOP] * len(threads))
        for thread in threads:
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

    def spawn(self, *, limit: int | None = None) -> bool:
        """One more handler thread (when work waits and no thread is free, and in
        place of an abandoned one); with ``limit``, only while fewer run."""
        with self._holdings.lock:
            if limit is not None and len(self.threads) >= limit:
                return False
            self._spawned += 1
            name = f"jobs-worker-{self._spawned - 1}"
            thread = threading.Thread(target=self._thread_main, name=name, daemon=True)
            self.threads.append(thread)
        thread.start()
        return True

    def retire(self, thread: threading.Thread | None) -> None:
        """Forget ``thread`` (its attempt was abandoned; it ends when its handler does)."""
        with self._holdings.lock:
            if thread is not None and thread in self.threads:
                self.threads.remove(thread)

    def _thread_main(self) -> None:
        try:
            while True:
                work = self._work.get()
                if isinstance(work, Stop):
                    return
                # A claim taken from the queue counts among the handlers running.
                after: AfterAttempt
                if isinstance(work, Claim):
                    after = self._execute(work)
                elif isinstance(work, SettleHere):
                    after = self._settle_here()
                else:
                    after = self._write_loop_end(work)
                while isinstance(after, RunNext):
                    if not self._work.try_run():
                        # As many handlers run as the concurrency allows: it waits.
                        self._start_threads(self._work.put_first(after.claim))
                        after = SlotIdle.WAIT
                        break
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
            held.running = True
        if self._worker.stopping:
            # Claimed but not started when the worker began to stop: give it back
            # rather than start work the shutdown would then interrupt.
            self.handler_stopped(held)
            self.give_back(claim)
            return SlotIdle.WAIT
        try:
            return self._after_handler(claim, lambda: self._run_handler(claim, held))
        finally:
            if held.running and not held.on_loop:
                self.handler_stopped(held)  # whatever happened, its place is free

    def handler_stopped(self, held: HeldAttempt) -> None:
        """The handler of ``held`` no longer runs (returned, or abandoned at its
        timeout): another claim may start. Once per attempt."""
        self._work.handler_returned(held)

    def _write_loop_end(self, returned: LoopEnd) -> AfterAttempt:
        """On a thread: write the end of an ``async def`` handler that ran on the loop,
        as its slot would have (this thread's own attempt, if any, is unaffected)."""
        claim, end, marked = returned.claim, returned.end, returned.returned
        after = self._after_handler(
            claim, lambda: self._handler_returned(claim, end, marked=marked)
        )
        # An attempt abandoned at its timeout had no thread of its own to retire.
        return SlotIdle.WAIT if after is SlotIdle.RETIRE else after

    def _after_handler(self, claim: Claim, run: Callable[[], HandlerEnd]) -> AfterAttempt:
        """``run()`` a handler's part of the attempt (or its end's), then what the
        thread does next: the claim it settled and kept, or wait, or retire."""
        end = HandlerEnd.WRITTEN
        try:
            end = run()
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
        if end is HandlerEnd.ON_LOOP:
            return SlotIdle.WAIT
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
        self._typical_run_time = _moved(self._typical_run_time, seconds)

    def _run_handler(self, claim: Claim, held: HeldAttempt) -> HandlerEnd:
        """Run the attempt's handler and write (or defer) its end; an ``async def``
        handler is only started on the event loop (:meth:`_start_on_loop`)."""
        worker, ctx = self._worker, held.ctx
        drop_closed_connections()  # a server restart must not cost the job an attempt
        begun = begin_attempt(ctx, lambda spec: self._handler_starting(claim, spec))
        if isinstance(begun, AttemptEnd):
            self.handler_stopped(held)
            return self._handler_returned(claim, begun)
        chain = chain_for(begun)  # the handler inside JOBS["MIDDLEWARE"]
        if begun.is_async:
            self._start_on_loop(claim, held, begun, chain)
            return HandlerEnd.ON_LOOP
        if len(self.threads) < worker.concurrency:  # this thread is taken until it returns
            self._start_threads(self._work.unserved())
        try:
            result = begun.checked_result(chain(ctx))
        except Exception as exc:
            end = attempt_ended(begun, ctx, worker.clock, error=exc)
        else:
            end = attempt_ended(begun, ctx, worker.clock, result=result)
        finally:
            self.handler_stopped(held)
        return self._handler_returned(claim, end)

    def _start_on_loop(
        self, claim: Claim, held: HeldAttempt, spec: HandlerSpec, chain: Callable[..., Any]
    ) -> None:
        """Start an ``async def`` handler as a task on the event loop (handed there
        with the other starts of the moment: one wake-up of the loop for a batch);
        when it is done, its end is decided there (:meth:`_loop_returned`). A
        timeout cancels the task."""
        ctx = held.ctx
        coro = spec.coroutine(ctx, chain)
        with self._holdings.lock:
            held.on_loop = True
        clock = self._worker.clock

        def done(task: asyncio.Task[Any]) -> None:
            self.handler_stopped(held)
            try:
                try:
                    result = spec.checked_result(task.result())
                except (Exception, asyncio.CancelledError) as exc:
                    end = attempt_ended(spec, ctx, clock, error=exc)
                else:
                    end = attempt_ended(spec, ctx, clock, result=result)
                self._loop_returned(claim, end)
            except Exception:
                # Its lease is no longer renewed once dropped: recovery re-queues it.
                logger.exception(
                    "ending job %s failed; it will be recovered",
                    claim.job_id,
                    extra=attempt_fields(claim),
                )

        def start(loop: asyncio.AbstractEventLoop) -> None:
            task = loop.create_task(coro)
            task.add_done_callback(done)
            ctx._on_cancel(lambda: loop.call_soon_threadsafe(task.cancel), CancelReason.TIMEOUT)

        loop = self.event_loop()
        with self._starts_lock:
            self._starts.append(start)
            if self._starts_due:
                return  # the loop is told already and takes this one too
            self._starts_due = True
        try:
            loop.call_soon_threadsafe(self._run_starts, loop)
        except BaseException:
            with self._holdings.lock:
                held.on_loop = False  # it never started: its thread frees the place
            raise

    def _run_starts(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop: start every task handed over since the last time."""
        with self._starts_lock:
            starts, self._starts = self._starts, []
            self._starts_due = False
        for start in starts:
            start(loop)

    def _loop_returned(self, claim: Claim, end: AttemptEnd) -> None:
        """On the event loop, an ``async def`` handler's end: a success joins the next
        settle there and then (no thread needed, unless it completes the batch); any
        other end is queued, in front, for a thread to write."""
        item: LoopEnd | SettleHere = LoopEnd(claim, end)
        if end.ending is Ending.SUCCEEDED:
            if not self._mark_returned(claim, end):
                return  # abandoned: its end was written without it
            deferral = self._worker.settler.defer(claim, end.result)
            if deferral is Deferral.QUEUED:
                return
            item = SETTLE_HERE if deferral is Deferral.SETTLE_HERE else LoopEnd(claim, end, True)
        self._start_threads(self._work.put_first(item))

    def _settle_here(self) -> AfterAttempt:
        """On a thread: settle the batch an ``async def`` handler's success completed."""
        next_claim = self._worker.settler.settle_on_this_thread()
        return SlotIdle.WAIT if next_claim is None else RunNext(next_claim)

    def _mark_returned(self, claim: Claim, end: AttemptEnd) -> bool:
        """Note that the attempt's handler returned; False if the worker abandoned
        the attempt meanwhile (its end was written without it)."""
        with self._holdings.lock:
            held = self._holdings.get_locked(claim.token)
            if held is None or held.abandoned:
                return False
            held.returned = True
            if held.started_at is not None:
                self._note_run_time_locked(time.monotonic() - held.started_at)
        fault_point(
            "jobs.worker.handler_returned",
            job_id=claim.job_id,
            attempt=claim.attempt,
            ending=end.ending.value,
        )
        return True

    def _handler_returned(
        self, claim: Claim, end: AttemptEnd, *, marked: bool = False
    ) -> HandlerEnd:
        """The handler returned (or raised, or was never found): write or defer
        ``end``, unless the worker abandoned the attempt meanwhile (``marked``: it
        was noted returned already)."""
        worker = self._worker
        if not marked and not self._mark_returned(claim, end):
            return HandlerEnd.ABANDONED
        if end.ending is Ending.SUCCEEDED and worker.settler.defer_completion(claim, end.result):
            return HandlerEnd.DEFERRED
        worker.finisher.finish(
            claim, end.event, lambda: end.write(claim.token, now=worker.clock()), end.detail
        )
        return HandlerEnd.WRITTEN
