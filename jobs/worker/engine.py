"""The worker's engine: configuration, the main loop, recovery and retention."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.db import connections
from django.utils import timezone

from ledon.db import alias_for, is_postgres
from ledon.engine import FAILED, StopLevel
from ledon.faults import fault_point
from ledon.registry import EngineRecord

from .. import execution
from ..conf import jobs_settings
from ..models import Job
from ..signals import send_logged, worker_started, worker_stopping
from ..types import CancelReason, FinishOutcome
from .base import EventCallback, WorkerStats
from .shutdown import Shutdown

logger = logging.getLogger(__name__)

#: Finished jobs deleted per retention statement.
_PURGE_BATCH = 1000


class Worker(Shutdown):
    """Run jobs until stopped (or, with ``burst``, until nothing is due).

    ``run()`` blocks; ``stop()`` may be called from any thread (for signals, see
    :meth:`~ledon.engine.Engine.stop_on_signals`) and starts a graceful shutdown:
    claiming stops, running handlers get ``shutdown_timeout`` seconds to finish, then
    their cancellation signal is set, and after ``cancel_grace`` more seconds
    whatever still runs is recovered and re-queued (J11). A handler that returns
    because of the shutdown signal is re-queued, not completed. A second stop request
    signals cancellation at once; a third stops waiting for handlers.

    ``started`` is set once the worker claims (its own leftovers recovered);
    ``stopping`` tells whether a stop was requested.
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
        clock: Callable[[], datetime] = timezone.now,
        on_event: EventCallback | None = None,
        listen: bool | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self.queues = list(queues or [])
        self.worker_id = worker_id or execution.default_worker_id()
        self.burst = burst
        self.shutdown_timeout = shutdown_timeout
        self.clock = clock
        self.on_event = on_event
        self.settings = jobs_settings()
        self.cancel_grace = (
            self.settings.SHUTDOWN_GRACE_SECONDS if cancel_grace is None else cancel_grace
        )
        super().__init__(alias=alias_for(Job), log=logger)
        self.listen = is_postgres(connections[self.alias]) if listen is None else listen
        self._init_state()
        # Whether this worker id's own leftovers were recovered (J11, at start-up).
        self._own_recovered = False

    # ------------------------------------------------------------------ control

    def stop(self, *, immediate: bool = False) -> None:
        """Begin a graceful shutdown; ``immediate`` signals cancellation to the
        running handlers at once (the second level of :meth:`request_stop`)."""
        self.escalate(StopLevel.CANCEL if immediate else StopLevel.GRACEFUL)

    def _stop_level_reached(self, level: StopLevel) -> None:
        if level >= StopLevel.CANCEL:
            # On the thread that asked: the main loop may be busy (or backing off).
            with self._lock:
                entries = list(self._running.values())
            for entry in entries:
                entry.ctx.signal_cancel(CancelReason.SHUTDOWN)

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
        self._emit(event, None, detail)

    # ------------------------------------------------------------------ main loop

    def run(self) -> WorkerStats:
        logger.info(
            "worker %s starting",
            self.worker_id,
            extra={"worker": self.worker_id, "queues": self.queues},
        )
        if not self.wait_for_database():
            self._emit("stopped", None, self.stats.summary())
            return self.stats
        self._start_threads()
        try:
            # This worker id's leftovers are recovered before it claims anything, or
            # the recovery would take its own new attempts too.
            while not self._own_recovered and not self._stopping.is_set():
                self._recover()
                if not self._own_recovered:
                    self.pause(self.settings.POLL_INTERVAL)
            send_logged(worker_started, Worker, "worker_started", log=logger, worker=self)
            self.started.set()
            self._emit(
                "started", None, f"queues={self.queues or 'all'} concurrency={self.concurrency}"
            )
            self._loop_until_stopped()
            self._shutdown()
        finally:
            with self._lock:
                self._settling = False
            send_logged(worker_stopping, Worker, "worker_stopping", log=logger, worker=self)
            self._stop_threads()
            connections[self.alias].close()
        self._emit("stopped", None, self.stats.summary())
        return self.stats

    def _loop_until_stopped(self) -> None:
        s = self.settings
        now = time.monotonic()
        next_heartbeat = now + s.HEARTBEAT_SECONDS
        next_cancel_check = now + s.CANCEL_POLL_INTERVAL
        next_recovery = now + s.RECOVERY_INTERVAL
        next_cleanup = now  # retention runs once at start-up, then every interval
        while not self._stopping.is_set():
            self._wake.clear()
            now = time.monotonic()
            if self.outage.active:
                # When the database comes back, renew the leases before anything else.
                next_heartbeat = now
            if now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + s.HEARTBEAT_SECONDS
            if self._claims_unknown and not self.backing_off:
                self._recover_lost_claims()
            if now >= next_cancel_check or self._check_cancel_now.is_set():
                self._check_cancel_now.clear()
                self._check_cancel()
                next_cancel_check = now + s.CANCEL_POLL_INTERVAL
            if now >= next_recovery:
                self._recover()
                next_recovery = now + s.RECOVERY_INTERVAL
            next_timeout = self._enforce_timeouts()
            if s.RETENTION_SECONDS is not None and now >= next_cleanup:
                more = self._clean_up(s.RETENTION_SECONDS)
                # A long backlog goes one batch per pass, between heartbeats and claims.
                next_cleanup = now if more else now + s.CLEANUP_INTERVAL
            # The new claims are already on their way to the handler threads.
            claims, asked = self._settle(claim=True) if not self.backing_off else ([], 0)
            idle = not claims and not self._busy() and not self.backing_off
            if self.burst and idle and not self._due_held_by_limits():
                break
            if claims and len(claims) == asked:
                continue  # capacity was filled by a full batch: there may be more to take
            timeout = min(
                s.POLL_INTERVAL,
                max(next_heartbeat - now, 0.0),
                max(next_recovery - now, 0.0),
                max(next_cancel_check - now, 0.0) if self._running else s.POLL_INTERVAL,
                s.POLL_INTERVAL if next_timeout is None else next_timeout,
            )
            self.pause(max(timeout, 0.01))

    def _due_held_by_limits(self) -> bool:
        """Burst mode: are there due jobs in this worker's unpaused queues that only
        limits (J18) keep from its claim? They are due, so a burst waits for them
        (a slot frees, a rate window moves on); a paused queue's are not waited for."""
        if not execution.claim_limits().for_queues(self.queues):
            return False  # without limits, a claim that took nothing leaves nothing due
        counts = self.guarded(
            "counting due jobs",
            lambda: execution.due_counts_by_queue(now=self.clock(), paused=False),
        )
        if counts is FAILED:
            return True  # backing off; decided once the database answers
        return any(n for queue, n in counts.items() if not self.queues or queue in self.queues)

    # ------------------------------------------------------------------ recovery

    def _recover_lost_claims(self) -> None:
        """After a claim failed on the database it may still have committed, its
        answer lost with the connection: attempts leased by this worker that it does
        not run. Recover (re-queue) them now instead of when their lease expires."""
        with self._lock:
            if self._settles:
                return  # a settle is under way: next pass
            self._settles += 1  # and none starts meanwhile
            # No settle can claim until this one ends: what runs now is all there is.
            held = set(self._running)

        def recover() -> dict[str, FinishOutcome]:
            return execution.recover_worker(
                self.worker_id,
                keep=held,
                reason="recovered: claimed as the database failed; never run",
                now=self.clock(),
            )

        try:
            outcomes = self.guarded("recovering claims whose answer was lost", recover)
        finally:
            with self._lock:
                self._settles -= 1
        if outcomes is FAILED:
            return
        self._claims_unknown = False
        if outcomes:
            fault_point("jobs.worker.recovered", count=len(outcomes))
            self.stats.recovered += len(outcomes)
            self._emit("recovered", None, f"{len(outcomes)} claim(s) lost with the database")

    def _recover(self) -> None:
        """Recover attempts whose lease expired — and, the first time it succeeds,
        this worker id's own leftovers of an earlier run (J11)."""

        def recover() -> dict[str, FinishOutcome]:
            outcomes: dict[str, FinishOutcome] = {}
            if not self._own_recovered:
                outcomes.update(execution.recover_worker(self.worker_id, now=self.clock()))
                self._own_recovered = True
            outcomes.update(execution.recover_expired(now=self.clock()))
            # J18: the recorded starts that no rate window counts any more.
            execution.prune_claim_starts(now=self.clock())
            return outcomes

        outcomes = self.guarded("recovering expired attempts", recover)
        if outcomes is FAILED:
            return
        recovered = [t for t, o in outcomes.items() if o]
        if recovered:
            fault_point("jobs.worker.recovered", count=len(recovered))
            self.stats.recovered += len(recovered)
            self._emit("recovered", None, f"{len(recovered)} attempt(s) of stopped workers")
            logger.warning(
                "recovered %d attempt(s) whose worker stopped",
                len(recovered),
                extra={"worker": self.worker_id},
            )

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
            self._emit("purged", None, f"{count} finished job(s) past retention")
        return count == _PURGE_BATCH
