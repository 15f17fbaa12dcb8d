"""Settling: finishing the attempts whose handlers returned together with the next
claim, in one transaction and one commit (on PostgreSQL one statement).

A settle runs on the main loop, or on the handler thread whose attempt was the last
one running (:meth:`Settling._settles_here`): that thread then runs one of the new
claims itself, with no hand-over between threads. The capacity a settle asks for is
reserved until it returns, so settles running together never claim more than is
free: Running never exceeds the worker's concurrency.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError

from ledon.db import TRANSIENT_ERRORS
from ledon.faults import fault_point

from .. import execution
from ..exceptions import JobsError
from ..handlers import JobContext
from ..observability.log_fields import attempt_fields
from ..types import Claim
from .base import Running, WorkerBase

logger = logging.getLogger(__name__)


class Settling(WorkerBase):
    def _settle(
        self, *, claim: bool, alone: bool = False, keep: bool = False
    ) -> tuple[list[Claim], int]:
        """Finish the attempts whose handlers returned and, with ``claim``, claim due
        jobs for the capacity that is then free — one transaction, one commit.

        Each finish is still guarded by its own token and decides cancel-versus-finish
        in the database (J8); the batch only shares the commit. Runs on the main loop
        and on a handler thread that completed the last running job (each thread on
        its own connection); the capacity a settle asks for is reserved until it
        returns, so that settles running together never claim more than is free.
        Returns the new claims — registered as running and handed to the handler
        threads before the finishes are recorded (logs, signals, events), so that no
        handler waits for that book-keeping; with ``keep`` the first one is not handed
        over, and runs on the calling thread — and the number asked for.

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
                outcomes, claims = self._committed(
                    lambda: execution.complete_and_claim(
                        done,
                        self.worker_id,
                        limit=limit,
                        queues=self.queues or None,
                        now=self.clock(),
                    ),
                    # Without limits (J18) it is one statement; with them, several.
                    one_statement=self.settings.ASYNCHRONOUS_COMMIT
                    and not (limit and execution.claim_limits().for_queues(self.queues)),
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
            if done or claims:
                fault_point("jobs.worker.settled", finished=len(done), claimed=len(claims))
            with self._lock:
                for finished, _result in done:
                    self._running.pop(finished.token, None)
                for new in claims:
                    self._running[new.token] = Running(new, JobContext(new))
                self.stats.claimed += len(claims)
            for new in claims:
                fault_point("jobs.worker.claimed", job_id=new.job_id, attempt=new.attempt)
                self._emit("claimed", new, f"attempt {new.attempt}/{new.max_attempts}")
            for new in claims[1:] if keep else claims:
                self._tasks.put(new)
            for finished, _result in done:
                self._record(finished, "succeeded", outcomes[finished.token])
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
        hand-over); the rest are queued for the other threads. Returns the claim to
        run next, if any."""
        claims, _limit = self._settle(claim=True, alone=True, keep=True)
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
        worker then never hands a job between threads. Called with the lock held.

        No thread starts a settle beside one under way to save its wait. Measured
        (``python -m benchmarks --only burn-down``): settles started on the handler
        threads whenever fewer than 4, or 16, were under way — each on its thread's
        connection, claiming its next job itself, the capacity of a settle under way
        counted once — shrank the batches to one or two jobs, each batch its own
        statement and commit. On a shared two-core server the statements' server
        time, not the WAL flush, bounds the rate: no-op jobs at concurrency 4 and 16
        and the 5 ms handler at 16 all ran at a third to two thirds of one settle at
        a time."""
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
