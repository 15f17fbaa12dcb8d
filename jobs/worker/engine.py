"""The worker: its configuration, the parts it is made of, and the main loop that
drives them (heartbeat, cancellation checks, recovery, timeouts, retention, settles)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.db import connections

from ledon.burst import Burst
from ledon.clock import now as database_now
from ledon.db import alias_for, is_postgres
from ledon.engine import FAILED, Engine, StopLevel
from ledon.faults import fault_point
from ledon.registry import EngineRecord

from .. import execution
from ..conf import jobs_settings
from ..models import Job
from ..signals import send_logged, worker_started, worker_stopping
from ..types import CancelReason, Claim
from .finishing import Finisher
from .holdings import EventCallback, Holdings, WorkerStats
from .leases import LeaseKeeper
from .recovery import Recovery
from .settler import NOTHING_SETTLED, Settler, SettleResult
from .shutdown import ShutdownSequence
from .slots import Slots
from .timeouts import TimeoutWatch

logger = logging.getLogger(__name__)

#: Finished jobs deleted per retention statement.
_PURGE_BATCH = 1000


class Worker(Engine):
    """Run jobs until stopped (or, with ``burst``, until nothing is due).

    ``run()`` blocks; ``stop()`` may be called from any thread (for signals, see
    :meth:`~ledon.engine.Engine.stop_on_signals`) and starts a graceful shutdown:
    claiming stops, running handlers get ``shutdown_timeout`` seconds to finish, then
    their cancellation signal is set, and after ``cancel_grace`` more seconds
    whatever still runs is recovered (re-queued while attempts remain). A handler
    that returns because of the shutdown signal, and a claim no handler started, are
    released: Queued again, the attempt unused. A second stop request signals
    cancellation at once; a third stops waiting for handlers.

    ``started`` is set once the worker claims (its own leftovers recovered);
    ``stopping`` tells whether a stop was requested.

    The worker is made of parts, each owning its state (see
    ``docs/architecture.md``): :attr:`holdings` (the attempts it holds),
    :attr:`slots` (handler threads, event loop, LISTEN), :attr:`settler` (finishes
    in batches with the next claim), :attr:`finisher` (one attempt's end, and the
    record of every end), :attr:`leases` (heartbeat and cancellation watch),
    :attr:`timeouts`, :attr:`recovery` and :attr:`shutdown_sequence`.
    """

    kind = "worker"
    app_label = "jobs"

    def __init__(
        self,
        *,
        concurrency: int = 1,
        queues: Sequence[str] | None = None,
        worker_id: str | None = None,
        burst: bool = False,
        shutdown_timeout: float = 20.0,
        cancel_grace: float | None = None,
        clock: Callable[[], datetime] = database_now,
        on_event: EventCallback | None = None,
        listen: bool | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self.queues = list(queues or [])
        self.worker_id = worker_id or execution.default_worker_id()
        self.burst = burst
        #: With ``burst``: the engines of this burst (see :mod:`ledon.burst`), the
        #: worker first; those beside it join from ``worker_started``.
        self.burst_round = Burst() if burst else None
        self._in_burst = (
            None if self.burst_round is None else self.burst_round.join("worker", self.wake)
        )
        self.shutdown_timeout = shutdown_timeout
        self.clock = clock
        self.on_event = on_event
        self.settings = jobs_settings()
        self.cancel_grace = (
            self.settings.SHUTDOWN_GRACE_SECONDS if cancel_grace is None else cancel_grace
        )
        super().__init__(alias=alias_for(Job), log=logger)
        self.listen = is_postgres(connections[self.alias]) if listen is None else listen
        self.stats = WorkerStats()
        self.holdings = Holdings()
        self.finisher = Finisher(self)
        self.settler = Settler(self)
        self.slots = Slots(self)
        self.leases = LeaseKeeper(self)
        self.timeouts = TimeoutWatch(self)
        self.recovery = Recovery(self)
        self.shutdown_sequence = ShutdownSequence(self)
        self._stopping_sent = False

    # ------------------------------------------------------------------ for the parts

    def clear_wake(self) -> None:
        self._wake.clear()

    @property
    def cancelling_event(self) -> threading.Event:
        """Set once the stop level reached CANCEL."""
        return self._cancelling

    @property
    def aborting_event(self) -> threading.Event:
        """Set once the stop level reached ABORT."""
        return self._aborting

    def emit(self, event: str, claim: Claim | None = None, detail: str = "") -> None:
        """Tell the event callback (``run_jobs`` prints it) about ``event``."""
        if self.on_event is not None:
            self.on_event(event, claim, detail)

    def attempts_ended(self) -> None:
        """Attempts' ends are committed and recorded (their signals' receivers ran): in
        a burst, what they queued (a batch's ``then``, a sequence's next job, a workflow
        run's next advance) is for a claim pass that begins after this."""
        if self._in_burst is not None:
            self._in_burst.worked()

    def busy(self) -> bool:
        """Whether an attempt is held (running, waiting to run, or returned and not
        finished) or a settle is under way."""
        return self.holdings.count() > 0 or self.settler.under_way()

    @property
    def running_tokens(self) -> list[str]:
        return self.holdings.tokens()

    def running_count(self) -> int:
        return self.holdings.count()

    # ------------------------------------------------------------------ control

    def stop(self, *, immediate: bool = False) -> None:
        """Begin a graceful shutdown; ``immediate`` signals cancellation to the
        running handlers at once (the second level of :meth:`request_stop`)."""
        self.escalate(StopLevel.CANCEL if immediate else StopLevel.GRACEFUL)

    def _stop_level_reached(self, level: StopLevel) -> None:
        if level >= StopLevel.CANCEL:
            # On the thread that asked: the main loop may be busy (or backing off).
            for held in self.holdings.entries():
                held.ctx.signal_cancel(CancelReason.SHUTDOWN)

    def registry_record(self) -> EngineRecord:
        return EngineRecord(
            kind=self.kind,
            engine_id=self.worker_id,
            queues=tuple(self.queues),
            concurrency=self.concurrency,
        )

    def report(self, event: str, detail: str = "") -> None:
        """Tell the worker's event callback about ``event`` (for work running beside
        the worker, such as saga recovery); ``run_jobs`` prints it."""
        self.emit(event, None, detail)

    # ------------------------------------------------------------------ main loop

    def run(self) -> WorkerStats:
        logger.info(
            "worker %s starting",
            self.worker_id,
            extra={"worker": self.worker_id, "queues": self.queues},
        )
        if not self.wait_for_database():
            self.emit("stopped", None, self.stats.summary())
            return self.stats
        self.slots.start()
        try:
            # This worker id's leftovers are recovered before it claims anything, or
            # the recovery would take its own new attempts too.
            while not self.recovery.own_recovered and not self.stopping:
                self.recovery.recover()
                if not self.recovery.own_recovered:
                    self.pause(self.settings.POLL_INTERVAL)
            send_logged(worker_started, Worker, "worker_started", log=logger, worker=self)
            self.started.set()
            self.emit(
                "started", None, f"queues={self.queues or 'all'} concurrency={self.concurrency}"
            )
            self._loop_until_stopped()
            # What runs beside the worker (the scheduler) stops with the claiming,
            # not after the handlers: nothing is enqueued during a graceful shutdown.
            self._send_stopping()
            self.shutdown_sequence.run()
        finally:
            self.settler.stop_accepting()
            self._send_stopping()
            self.slots.stop()
            connections[self.alias].close()
        self.emit("stopped", None, self.stats.summary())
        return self.stats

    def _send_stopping(self) -> None:
        """End the burst (if any), then send ``worker_stopping`` (once)."""
        if self.burst_round is not None:
            self.burst_round.end()
        if not self._stopping_sent:
            self._stopping_sent = True
            send_logged(worker_stopping, Worker, "worker_stopping", log=logger, worker=self)

    def _loop_until_stopped(self) -> None:
        s = self.settings
        now = time.monotonic()
        next_heartbeat = now + s.HEARTBEAT_SECONDS
        next_cancel_check = now + s.CANCEL_POLL_INTERVAL
        next_recovery = now + s.RECOVERY_INTERVAL
        next_cleanup = now  # retention runs once at start-up, then every interval
        while not self.stopping:
            self._wake.clear()
            mark = 0 if self._in_burst is None else self._in_burst.mark()
            now = time.monotonic()
            if self.outage.active:
                # When the database comes back, renew the leases before anything else.
                next_heartbeat = now
            if now >= next_heartbeat:
                self.leases.heartbeat()
                next_heartbeat = now + s.HEARTBEAT_SECONDS
            if self.settler.claims_unknown and not self.backing_off:
                self.recovery.recover_lost_claims()
            if self.leases.check_due() or now >= next_cancel_check:
                self.leases.check_cancel()
                next_cancel_check = now + s.CANCEL_POLL_INTERVAL
            if now >= next_recovery:
                self.recovery.recover()
                next_recovery = now + s.RECOVERY_INTERVAL
            next_timeout = _earliest(self.timeouts.enforce(), self.slots.hand_back_stale())
            if s.RETENTION_SECONDS is not None and now >= next_cleanup:
                more = self._clean_up(s.RETENTION_SECONDS)
                # A long backlog goes one batch per pass, between heartbeats and claims.
                next_cleanup = now if more else now + s.CLEANUP_INTERVAL
            # The new claims are already on their way to the slots.
            settled = NOTHING_SETTLED if self.backing_off else self.settler.settle(claim=True)
            if not settled.claims:
                fault_point("jobs.worker.nothing_claimed")
            if self._burst_over(settled, mark):
                break
            if settled.filled:
                continue  # capacity was filled by a full batch: there may be more to take
            timeout = min(
                s.POLL_INTERVAL,
                max(next_heartbeat - now, 0.0),
                max(next_recovery - now, 0.0),
                max(next_cancel_check - now, 0.0) if self.holdings.count() else s.POLL_INTERVAL,
                s.POLL_INTERVAL if next_timeout is None else next_timeout,
            )
            self.pause(max(timeout, 0.01))

    def _burst_over(self, settled: SettleResult, mark: int) -> bool:
        """Burst mode: this pass, which began at ``mark``, found nothing — it claimed
        nothing, nothing is held or being settled, no end was recorded and nothing an
        engine beside the worker did was committed since it began (that work may have
        queued jobs its claim could not see), and no due job waits only for a limit —
        and every engine of the burst is as quiet (see :mod:`ledon.burst`)."""
        member = self._in_burst
        if member is None:
            return False
        if settled.claims:
            member.active()
            return False
        if self.busy() or self.backing_off or self._due_held_by_limits():
            return False
        return member.quiet(mark)

    def _due_held_by_limits(self) -> bool:
        """Burst mode: are there due jobs in this worker's unpaused queues that only
        flow limits keep from its claim? They are due, so a burst waits for them (a
        slot frees, a rate window moves on); a paused queue's are not waited for."""
        if not execution.claim_limits().for_queues(self.queues):
            return False  # without limits, a claim that took nothing leaves nothing due
        counts = self.guarded(
            "counting due jobs",
            lambda: execution.due_counts_by_queue(now=self.clock(), paused=False),
        )
        if counts is FAILED:
            return True  # backing off; decided once the database answers
        return any(n for queue, n in counts.items() if not self.queues or queue in self.queues)

    # ------------------------------------------------------------------ retention

    def _clean_up(self, retention_seconds: float) -> bool:
        """Retention: delete one batch of finished jobs older than
        ``retention_seconds``; True if a full batch went (more may be left)."""
        cutoff = self.clock() - timedelta(seconds=retention_seconds)
        count = self.guarded(
            "retention clean-up",
            lambda: execution.purge_finished(older_than=cutoff, limit=_PURGE_BATCH),
        )
        if count is FAILED:
            return False
        if count:
            self.stats.purged += count
            self.emit("purged", None, f"{count} finished job(s) past retention")
        return count == _PURGE_BATCH


def _earliest(*delays: float | None) -> float | None:
    """The shortest of ``delays`` that are set (None: none is)."""
    known = [d for d in delays if d is not None]
    return min(known) if known else None
