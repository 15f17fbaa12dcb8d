"""The settler: finishes the attempts whose handlers returned together with the next
claim, in one transaction and one commit (on PostgreSQL one statement).

A settle runs on the main loop, or on the slot whose attempt was the last one
running (:meth:`Settler.settles_here`): that slot then runs one of the new claims
itself, with no hand-over between threads. The capacity a settle asks for is
reserved until it returns, so settles running together never claim more than is
free: the handlers running and the claims waiting for a slot never exceed the
worker's concurrency plus its look-ahead (an attempt whose handler returned, its
finish not yet committed, holds no place).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import DatabaseError

from ledon.db import TRANSIENT_ERRORS
from ledon.faults import fault_point

from .. import execution
from ..exceptions import JobsError
from ..observability.log_fields import attempt_fields
from ..types import Claim
from .interfaces import Deferral, WorkerInterface

logger = logging.getLogger("jobs.worker")

#: A successful attempt waiting for the next settle, with its result reference.
Completion = tuple[Claim, str | None]


@dataclass(frozen=True, slots=True)
class SettleResult:
    """What one settle did: the jobs it claimed, out of how many it asked for."""

    claims: tuple[Claim, ...] = ()
    asked: int = 0

    @property
    def filled(self) -> bool:
        """It claimed all it asked for: more may be due."""
        return bool(self.claims) and len(self.claims) == self.asked


NOTHING_SETTLED = SettleResult()


class Settler:
    """Finishes returned attempts in batches, claiming for the capacity they free.

    Its state — completions waiting, settles under way, capacity they reserved —
    is guarded by the worker's one lock (:attr:`Holdings.lock`), read together with
    the held attempts.
    """

    def __init__(self, worker: WorkerInterface) -> None:
        self._worker = worker
        self._holdings = worker.holdings
        self._lock = worker.holdings.lock
        self._completed: list[Completion] = []
        # Completions are taken until the shutdown's last settle; after it, each
        # slot finishes its own attempt.
        self._accepting = True
        self._under_way = 0
        self._reserved = 0
        #: A claim failed on the database: it may have committed with its answer lost.
        self.claims_unknown = False

    # ------------------------------------------------------------------ queries

    def under_way(self) -> bool:
        with self._lock:
            return self._under_way > 0

    def has_completions(self) -> bool:
        with self._lock:
            return bool(self._completed)

    def completions(self) -> dict[str, str | None]:
        """The completions still waiting (the database failed when they were due)."""
        with self._lock:
            return {claim.token: result for claim, result in self._completed}

    def exclusive(self) -> bool:
        """Mark a settle under way if none is (True), so that none starts until
        :meth:`end_exclusive`: what the worker holds is then all it holds."""
        with self._lock:
            if self._under_way:
                return False
            self._under_way += 1
            return True

    def end_exclusive(self) -> None:
        with self._lock:
            self._under_way -= 1

    # ------------------------------------------------------------------ settling

    def settle(self, *, claim: bool, alone: bool = False, keep: bool = False) -> SettleResult:
        """Finish the attempts whose handlers returned and, with ``claim``, claim due
        jobs for the capacity that is then free — one transaction, one commit.

        Each finish is still guarded by its own token and decides cancel-versus-finish
        in the database; the batch only shares the commit. Runs on the main loop and
        on a slot whose attempt completed the last running job (each thread on its own
        connection). The new claims are registered as held and handed to the slots
        before the finishes are recorded (logs, signals, events), so that no handler
        waits for that book-keeping; with ``keep`` the first one is not handed over:
        it runs on the calling thread.

        If the database is unreachable, the finished attempts stay held (their leases
        are renewed) and wait for the next settle, after the back-off; nothing wakes
        the main loop early. With ``alone`` (a slot), it settles only if
        :meth:`settles_here` says so.
        """
        worker = self._worker
        with self._lock:
            if alone and (not self._completed or not self._settles_here() or worker.backing_off):
                return NOTHING_SETTLED
            done, self._completed = self._completed, []
            limit = 0
            if claim and not worker.stopping:
                limit = worker.slots.claimable_locked(reserved=self._reserved)
                limit = max(min(limit, worker.settings.CLAIM_BATCH_SIZE), 0)
            if not done and not limit:
                return NOTHING_SETTLED
            self._reserved += limit
            self._under_way += 1
        claims: list[Claim] = []
        failed = False
        began = worker.outage.clock()
        started = time.monotonic()
        try:
            try:
                outcomes, claims = worker.finisher.committed(
                    lambda: execution.complete_and_claim(
                        done,
                        worker.worker_id,
                        limit=limit,
                        queues=worker.queues or None,
                        now=worker.clock(),
                    ),
                    # Without flow limits it is one statement; with them, several.
                    one_statement=worker.settings.ASYNCHRONOUS_COMMIT
                    and not (limit and execution.claim_limits().for_queues(worker.queues)),
                )
            except TRANSIENT_ERRORS as exc:
                failed = True
                with self._lock:
                    self._completed[:0] = done
                    self.claims_unknown = self.claims_unknown or limit > 0
                worker.database_failed("finishing and claiming jobs", exc, began=began)
                return SettleResult((), limit)
            except (DatabaseError, JobsError):
                logger.exception(
                    "finishing and claiming jobs failed; finishing one by one",
                    extra={"worker": worker.worker_id, "finished": len(done), "claim_limit": limit},
                )
                worker.reset_connection()
                for finished, result in done:
                    self.finish_alone(finished, result)
                return SettleResult((), limit)
            worker.database_ok()
            if done or claims:
                fault_point("jobs.worker.settled", finished=len(done), claimed=len(claims))
            with self._lock:
                for finished, _result in done:
                    self._holdings.drop_locked(finished.token)
                for new in claims:
                    self._holdings.add_locked(new)
                worker.stats.claimed += len(claims)
                if limit:  # how long a slot's next claim is on its way (the look-ahead)
                    worker.slots.note_round_trip_locked(time.monotonic() - started)
            for new in claims:
                fault_point("jobs.worker.claimed", job_id=new.job_id, attempt=new.attempt)
                worker.emit("claimed", new, f"attempt {new.attempt}/{new.max_attempts}")
            worker.slots.hand_over(claims[1:] if keep else claims)
            for finished, _result in done:
                worker.finisher.record(finished, "succeeded", outcomes[finished.token])
            if done:
                worker.attempts_ended()
            for finished, _result in done:
                fault_point("jobs.worker.done_with", job_id=finished.job_id)
            return SettleResult(tuple(claims), limit)
        finally:
            with self._lock:
                self._reserved -= limit
                self._under_way -= 1
                # Completions left for the main loop, or a shutdown waiting for
                # settles to end — unless the database failed: then the main loop
                # backs off first. A claim that found fewer due jobs than it asked
                # for wakes nothing: there is nothing more to take until a job is
                # queued (NOTIFY) or the poll interval passes.
                wake = not failed and (bool(self._completed) or worker.stopping)
            if wake:
                worker.wake()

    def settle_on_this_thread(self) -> Claim | None:
        """On a slot whose attempt succeeded: settle now if :meth:`settles_here`
        says so, keeping one new claim to run on this thread (no hand-over); the rest
        go to the other slots. Returns the claim to run next, if any."""
        result = self.settle(claim=True, alone=True, keep=True)
        return result.claims[0] if result.claims else None

    def defer_completion(self, claim: Claim, result: str | None) -> bool:
        """Queue a successful attempt for the next settle; False once none follows.

        The slot then settles it itself (see :meth:`settles_here`) or leaves it to
        the main loop, which it wakes; a settle under way wakes the main loop for
        completions it leaves behind.
        """
        return self.defer(claim, result) is not Deferral.REFUSED

    def defer(self, claim: Claim, result: str | None) -> Deferral:
        """:meth:`defer_completion`, saying whether the caller settles now."""
        with self._lock:
            if not self._accepting:
                return Deferral.REFUSED
            self._completed.append((claim, result))
            if self._settles_here():
                return Deferral.SETTLE_HERE
        self._worker.wake()
        return Deferral.QUEUED

    def _settles_here(self) -> bool:
        """Whether the slot that just queued a completion settles it itself: when no
        other handler runs nor waits (the batch is complete — batches, not parallel
        small settles, make throughput) and no settle is under way. At concurrency 1
        the worker then never hands a job between threads. Called with the lock held.

        No slot starts a settle beside one under way to save its wait: smaller
        parallel settles, each its own statement and commit, ran slower on a shared
        server than one settle at a time.
        """
        return (
            not self._worker.stopping
            and self._under_way == 0
            and len(self._completed) == self._holdings.count_locked()
        )

    def close(self) -> None:
        """Finish what was handed over; later results are finished by their slots."""
        with self._lock:
            self._accepting = False
        self.settle(claim=False)

    def stop_accepting(self) -> None:
        with self._lock:
            self._accepting = False

    def finish_alone(self, claim: Claim, result: str | None) -> None:
        """Complete one attempt on its own (its batch failed) and let its slot go."""
        worker = self._worker
        try:
            worker.finisher.finish(
                claim,
                "succeeded",
                lambda: execution.complete(claim.token, result, now=worker.clock()),
            )
        except JobsError:
            logger.exception(
                "finishing job %s failed; it will be recovered",
                claim.job_id,
                extra=attempt_fields(claim),
            )
        finally:
            worker.slots.release(claim)
