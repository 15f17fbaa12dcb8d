"""The executor engine behind ``manage.py run_jobs`` (J14).

A :class:`Worker` claims due jobs only for free capacity, runs their handlers on a
fixed set of threads (``async def`` handlers on one event loop), renews the leases
of its running attempts by heartbeat, passes cancellation requests to handlers,
finishes each attempt through the store, and recovers attempts whose worker died.

Every write goes through :mod:`jobs.execution`, fenced by the attempt's token: if
this worker lost an attempt (it was recovered elsewhere), its late result changes
nothing. When the database is unreachable the worker keeps what it knows (the
attempts that ended, their results), backs off, says so once per outage (see
:mod:`ledon.engine`) and finishes them when the database is back.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError, connections
from django.utils import timezone

from ledon.db import DATABASE_ERRORS, TRANSIENT_ERRORS
from ledon.engine import FAILED, Engine, StopLevel
from ledon.registry import EngineRecord
from outbox.pglisten import Listener

from . import execution, store
from .conf import jobs_settings
from .db import alias_for, is_postgres
from .exceptions import JobsError, UnknownHandler
from .handlers import JobContext, get_handler
from .log_fields import attempt_fields
from .models import Job
from .signals import finished_attempt, send_logged, worker_started, worker_stopping
from .types import Claim, ExecutionStatus, FinishOutcome

logger = logging.getLogger(__name__)

#: A callback for what the worker does: (event, claim or None, detail).
EventCallback = Callable[[str, Claim | None, str], None]

#: Finished jobs deleted per retention statement.
_PURGE_BATCH = 1000


@dataclass(slots=True)
class WorkerStats:
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    requeued: int = 0
    interrupted: int = 0
    stale: int = 0
    recovered: int = 0
    purged: int = 0
    put_back: int = 0

    def count(self, outcome: FinishOutcome) -> None:
        name = {
            FinishOutcome.SUCCEEDED: "succeeded",
            FinishOutcome.FAILED: "failed",
            FinishOutcome.CANCELLED: "cancelled",
            FinishOutcome.INTERRUPTED: "interrupted",
            FinishOutcome.REQUEUED: "requeued",
            FinishOutcome.STALE: "stale",
            FinishOutcome.PUT_BACK: "put_back",
        }[outcome]
        setattr(self, name, getattr(self, name) + 1)

    def summary(self) -> str:
        return (
            f"claimed {self.claimed}, succeeded {self.succeeded}, failed {self.failed}, "
            f"retries scheduled {self.retried}, cancelled {self.cancelled}, "
            f"re-queued {self.requeued}, recovered {self.recovered}, purged {self.purged}"
            + (f", put back (unknown handler) {self.put_back}" if self.put_back else "")
        )


@dataclass(slots=True)
class _Running:
    claim: Claim
    ctx: JobContext


class Worker(Engine):
    """Run jobs until stopped (or, with ``burst``, until nothing is due).

    ``run()`` blocks; ``stop()`` may be called from any thread (for signals, see
    :meth:`~ledon.engine.Engine.stop_on_signals`) and starts a graceful shutdown:
    claiming stops, running handlers get ``shutdown_timeout`` seconds to finish, then
    their cancellation signal is set, and after ``cancel_grace`` more seconds
    whatever still runs is recovered and re-queued (J11). A handler that returns
    because of the shutdown signal is re-queued, not completed. A second stop request
    signals cancellation at once; a third stops waiting for handlers.
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
        self.stats = WorkerStats()
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._check_cancel_now = threading.Event()
        self._tasks: queue.Queue[Claim | None] = queue.Queue()
        # Successful attempts whose handlers returned, waiting for the main loop to
        # finish them together with its next claim (one commit for the lot).
        self._completed: list[tuple[Claim, str | None]] = []
        self._settling = True
        # Settles under way, and the capacity their claims may still take.
        self._settles = 0
        self._reserved = 0
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._listener: Listener | None = None
        # Whether this worker id's own leftovers were recovered (J11, at start-up).
        self._own_recovered = False
        # A claim failed on the database: it may have committed with its answer lost.
        self._claims_unknown = False
        self.started = threading.Event()

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
                entry.ctx.signal_cancel(shutdown=True)

    @property
    def stop_requested(self) -> bool:
        """Whether :meth:`stop` was called (a signal, not the end of a burst)."""
        return self._stopping.is_set()

    @property
    def running_tokens(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def registry_record(self) -> EngineRecord:
        return EngineRecord(
            kind=self.kind,
            engine_id=self.worker_id,
            queues=tuple(self.queues),
            concurrency=self.concurrency,
        )

    def running_count(self) -> int:
        with self._lock:
            return len(self._running)

    def _busy(self) -> bool:
        """Whether a handler runs or waits to run, or a settle is under way."""
        with self._lock:
            return bool(self._running) or self._settles > 0

    def _emit(self, event: str, claim: Claim | None = None, detail: str = "") -> None:
        if self.on_event is not None:
            self.on_event(event, claim, detail)

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
            if s.RETENTION_SECONDS is not None and now >= next_cleanup:
                more = self._clean_up(s.RETENTION_SECONDS)
                # A long backlog goes one batch per pass, between heartbeats and claims.
                next_cleanup = now if more else now + s.CLEANUP_INTERVAL
            claims, asked = self._settle(claim=True) if not self.backing_off else ([], 0)
            for new in claims:
                self._tasks.put(new)
            if self.burst and not claims and not self._busy() and not self.backing_off:
                break
            if claims and len(claims) == asked:
                continue  # capacity was filled by a full batch: there may be more to take
            timeout = min(
                s.POLL_INTERVAL,
                max(next_heartbeat - now, 0.0),
                max(next_recovery - now, 0.0),
                max(next_cancel_check - now, 0.0) if self._running else s.POLL_INTERVAL,
            )
            self.pause(max(timeout, 0.01))

    def _settle(self, *, claim: bool, alone: bool = False) -> tuple[list[Claim], int]:
        """Finish the attempts whose handlers returned and, with ``claim``, claim due
        jobs for the capacity that is then free — one transaction, one commit.

        Each finish is still guarded by its own token and decides cancel-versus-finish
        in the database (J8); the batch only shares the commit. Runs on the main loop
        and on a handler thread that completed the last running job (each thread on
        its own connection); the capacity a settle asks for is reserved until it
        returns, so that settles running together never claim more than is free.
        Returns the new claims — registered as running, not yet handed to a thread —
        and the number asked for.

        If the database is unreachable, the finished attempts stay registered as
        running (their leases are renewed) and wait for the next settle, after the
        back-off; nothing wakes the main loop early. With ``alone`` (a handler
        thread), it settles only if :meth:`_settles_here` says so.
        """
        with self._lock:
            if alone and (not self._completed or not self._settles_here() or self.backing_off):
                return [], 0
            done, self._completed = self._completed, []
            limit = 0
            if claim and not self._stopping.is_set():
                # The attempts finished here free their capacity for this claim.
                free = self.concurrency - (len(self._running) - len(done)) - self._reserved
                limit = max(min(free, self.settings.CLAIM_BATCH_SIZE), 0)
            if not done and not limit:
                return [], 0
            self._reserved += limit
            self._settles += 1
        claims: list[Claim] = []
        failed = False
        try:
            try:
                outcomes, claims = execution.complete_and_claim(
                    done,
                    self.worker_id,
                    limit=limit,
                    queues=self.queues or None,
                    now=self.clock(),
                )
            except TRANSIENT_ERRORS as exc:
                failed = True
                with self._lock:
                    self._completed[:0] = done
                    self._claims_unknown = self._claims_unknown or limit > 0
                self.database_failed("finishing and claiming jobs", exc)
                return [], limit
            except (DatabaseError, JobsError):
                logger.exception(
                    "finishing and claiming jobs failed; finishing one by one",
                    extra={"worker": self.worker_id, "finished": len(done), "claim_limit": limit},
                )
                self.reset_connection()
                for finished, result in done:
                    self._finish_alone(finished, result)
                return [], limit
            self.database_ok()
            with self._lock:
                for finished, _result in done:
                    self._running.pop(finished.token, None)
            for finished, _result in done:
                self._record(finished, "succeeded", outcomes[finished.token])
            with self._lock:
                for new in claims:
                    self._running[new.token] = _Running(new, JobContext(new))
                self.stats.claimed += len(claims)
            for new in claims:
                self._emit("claimed", new, f"attempt {new.attempt}/{new.max_attempts}")
            return claims, limit
        finally:
            with self._lock:
                self._reserved -= limit
                self._settles -= 1
                # Completions left for the main loop, or a shutdown waiting for
                # settles to end — unless the database failed: then the main loop
                # backs off first. A claim that found fewer due jobs than it asked
                # for wakes nothing: there is nothing more to take until a job is
                # queued (NOTIFY) or the poll interval passes.
                wake = not failed and (bool(self._completed) or self._stopping.is_set())
            if wake:
                self._wake.set()

    def _settle_on_this_thread(self) -> Claim | None:
        """On a handler thread whose attempt succeeded: settle now if
        :meth:`_settles_here` says so, keep one new claim to run on this thread (no
        hand-over) and queue the rest. Returns the claim to run next, if any."""
        claims, _limit = self._settle(claim=True, alone=True)
        for new in claims[1:]:
            self._tasks.put(new)
        return claims[0] if claims else None

    def _defer_completion(self, claim: Claim, result: str | None) -> bool:
        """Queue a successful attempt for the next settle; False once none follows.

        The thread then settles it itself (see :meth:`_settles_here`) or leaves it to
        the main loop, which it wakes; a settle under way wakes the main loop for
        completions it leaves behind.
        """
        with self._lock:
            if not self._settling:
                return False
            self._completed.append((claim, result))
            if self._settles_here():
                return True
        self._wake.set()
        return True

    def _settles_here(self) -> bool:
        """Whether the thread that just queued a completion settles it itself: when
        no other handler runs (the batch is complete — batches, not parallel small
        settles, make throughput) and no settle is under way. At concurrency 1 the
        worker then never hands a job between threads. Called with the lock held."""
        return (
            not self._stopping.is_set()
            and self._settles == 0
            and len(self._completed) == len(self._running)
        )

    def _close_settling(self) -> None:
        """Finish what was handed over; later results are finished by their threads."""
        with self._lock:
            self._settling = False
        self._settle(claim=False)

    def _finish_alone(self, claim: Claim, result: str | None) -> None:
        try:
            self._finish(
                claim,
                "succeeded",
                lambda: execution.complete(claim.token, result, now=self.clock()),
            )
        except JobsError:
            logger.exception(
                "finishing job %s failed; it will be recovered",
                claim.job_id,
                extra=attempt_fields(claim),
            )
        finally:
            self._release(claim)

    def _release(self, claim: Claim) -> None:
        with self._lock:
            self._running.pop(claim.token, None)
        self._wake.set()

    def _heartbeat(self) -> None:
        self._watch(
            lambda tokens: execution.heartbeat(tokens, self.worker_id, now=self.clock()),
            "lease renewal",
        )

    def _check_cancel(self) -> None:
        self._watch(store.execution_statuses, "cancellation check")

    def _watch(self, read: Callable[[list[str]], dict[str, ExecutionStatus]], what: str) -> None:
        """Read the running attempts' states (renewing leases or not) and act on them."""
        tokens = self.running_tokens
        if not tokens:
            return
        states = self.guarded(what, lambda: read(tokens))
        if states is not FAILED:
            self._apply(states)

    def _apply(self, states: dict[str, ExecutionStatus]) -> None:
        with self._lock:
            entries = {t: self._running.get(t) for t in states}
        for token, state in states.items():
            entry = entries[token]
            if entry is None or entry.ctx.cancel_requested:
                continue
            if state is ExecutionStatus.CANCEL_REQUESTED:
                self._emit("cancel-requested", entry.claim)
                entry.ctx.signal_cancel()
            elif state is ExecutionStatus.ENDED:
                # The attempt ended elsewhere (recovered after a lost lease); whatever
                # the handler returns now is fenced off by its token.
                self._emit("lost", entry.claim, "attempt ended elsewhere; stopping handler")
                entry.ctx.signal_cancel(shutdown=True)

    def _recover_lost_claims(self) -> None:
        """After a claim failed on the database it may still have committed, its
        answer lost with the connection: attempts leased by this worker that it does
        not run. Recover (re-queue) them now instead of when their lease expires."""
        with self._lock:
            if self._settles:
                return  # a settle is under way: next pass
            self._settles += 1  # and none starts meanwhile

        def recover() -> dict[str, FinishOutcome]:
            leased = store.tokens_leased_by(self.worker_id)
            with self._lock:
                lost = [t for t in leased if t not in self._running]
            return {
                token: store.recover(
                    token,
                    requeue=True,
                    reason="recovered: claimed as the database failed; never run",
                    leased_by=self.worker_id,
                    now=self.clock(),
                )
                for token in lost
            }

        try:
            outcomes = self.guarded("recovering claims whose answer was lost", recover)
        finally:
            with self._lock:
                self._settles -= 1
        if outcomes is FAILED:
            return
        self._claims_unknown = False
        if outcomes:
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
            return outcomes

        outcomes = self.guarded("recovering expired attempts", recover)
        if outcomes is FAILED:
            return
        recovered = [t for t, o in outcomes.items() if o]
        if recovered:
            self.stats.recovered += len(recovered)
            self._emit("recovered", None, f"{len(recovered)} attempt(s) of stopped workers")
            logger.warning(
                "recovered %d attempt(s) whose worker stopped",
                len(recovered),
                extra={"worker": self.worker_id},
            )

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

    # ------------------------------------------------------------------ shutdown

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
                outcome = store.recover(
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

    # ------------------------------------------------------------------ threads

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
                self.alias, [channel, channel + "_cancel"], self._notified, name="jobs-listener"
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

    # ------------------------------------------------------------------ one attempt

    def _execute(self, claim: Claim) -> Claim | None:
        """Run one attempt; returns the next claim this thread runs, if it settled."""
        with self._lock:
            entry = self._running[claim.token]
        ctx = entry.ctx
        handed_over = False
        try:
            handed_over = self._run_handler(claim, ctx)
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
        """Run the attempt's handler and finish the attempt; True if a successful
        attempt was handed to the main loop, which finishes and releases it."""
        try:
            spec = get_handler(claim.handler, claim.handler_version)
        except UnknownHandler as exc:
            # J19: perhaps a newer worker knows it (a rolling deploy): put back.
            message = str(exc)
            self._finish(
                claim,
                "failed",
                lambda: execution.put_back_unknown_handler(claim.token, message, now=self.clock()),
                message,
            )
            return False
        try:
            loop = self._event_loop() if spec.is_async else None
            result = spec.invoke(ctx, loop)
        except Exception as exc:
            if ctx.stopped_by_shutdown:
                self._requeue_after_shutdown(claim)
                return False
            error, retry_at = spec.failure(ctx, exc, self.clock())
            detail = f"{type(exc).__name__}: {exc}"
            if retry_at is not None:
                detail += f" (retry at {retry_at.isoformat()})"
            self._finish(
                claim,
                "failed",
                lambda: execution.fail(claim.token, error, retry_at=retry_at, now=self.clock()),
                detail,
            )
            return False
        if ctx.stopped_by_shutdown:
            self._requeue_after_shutdown(claim)
            return False
        if self._defer_completion(claim, result):
            return True
        self._finish(
            claim, "succeeded", lambda: execution.complete(claim.token, result, now=self.clock())
        )
        return False

    def _requeue_after_shutdown(self, claim: Claim) -> None:
        self._finish(
            claim,
            "requeued",
            lambda: store.recover(
                claim.token, requeue=True, reason="worker shut down", now=self.clock()
            ),
            "stopped by shutdown",
        )

    def _finish(
        self, claim: Claim, event: str, call: Callable[[], FinishOutcome], detail: str = ""
    ) -> None:
        """Write the attempt's end, retrying with the engine's back-off while the
        database is unreachable (other database errors a few times). If it gives up
        — another error, or the worker aborts — the lease expires and another worker
        recovers the attempt."""
        try:
            outcome = self.retry_database(f"finishing job {claim.job_id}", call)
        except DATABASE_ERRORS:
            logger.warning(
                "finishing job %s failed; it is recovered when its lease expires",
                claim.job_id,
                extra=attempt_fields(claim),
            )
            return
        self._record(claim, event, outcome, detail)

    def _record(self, claim: Claim, event: str, outcome: FinishOutcome, detail: str = "") -> None:
        with self._lock:
            if outcome is FinishOutcome.REQUEUED and event == "failed":
                self.stats.retried += 1
                event = "retry-scheduled"
            else:
                self.stats.count(outcome)
                if outcome in (
                    FinishOutcome.CANCELLED,
                    FinishOutcome.STALE,
                    FinishOutcome.PUT_BACK,
                ):
                    event = outcome.value
        logger.info(
            "job %s %s",
            claim.job_id,
            event,
            extra=attempt_fields(claim, now=self.clock(), outcome=outcome.value, event=event),
        )
        finished_attempt(claim, outcome, retry_scheduled=event == "retry-scheduled")
        self._emit(event, claim, detail)
