"""Recovery: re-queue the attempts whose worker stopped (expired leases), this
worker id's leftovers of an earlier run (at start-up, before it claims), and claims
that may have committed while the database failed with their answer lost."""

from __future__ import annotations

import logging

from ledon.engine import FAILED
from ledon.faults import fault_point

from .. import execution
from ..types import FinishOutcome
from .interfaces import WorkerInterface

logger = logging.getLogger("jobs.worker")


class Recovery:
    """Recovers attempts no worker runs any more."""

    def __init__(self, worker: WorkerInterface) -> None:
        self._worker = worker
        #: Whether this worker id's own leftovers were recovered (once, at start-up).
        self.own_recovered = False

    def recover(self) -> None:
        """Recover attempts whose lease expired — and, the first time it succeeds,
        this worker id's own leftovers of an earlier run."""
        worker = self._worker

        def recover() -> dict[str, FinishOutcome]:
            outcomes: dict[str, FinishOutcome] = {}
            if not self.own_recovered:
                fault_point("jobs.worker.recovering", worker_id=worker.worker_id)
                outcomes.update(execution.recover_worker(worker.worker_id, now=worker.clock()))
                self.own_recovered = True
            outcomes.update(execution.recover_expired(now=worker.clock()))
            # The rate rows that hold nothing any more.
            execution.prune_rates(now=worker.clock())
            # The Queued jobs whose start deadline passed (no claim takes them).
            execution.expire_jobs(now=worker.clock())
            return outcomes

        outcomes = worker.guarded("recovering expired attempts", recover)
        if outcomes is FAILED:
            return
        recovered = [t for t, o in outcomes.items() if o]
        if recovered:
            fault_point("jobs.worker.recovered", count=len(recovered))
            worker.stats.recovered += len(recovered)
            worker.emit("recovered", None, f"{len(recovered)} attempt(s) of stopped workers")
            # The event above is what run_jobs prints; the log line is for log
            # collectors, at INFO so that the console does not say it twice.
            logger.info(
                "recovered %d attempt(s) whose worker stopped",
                len(recovered),
                extra={"worker": worker.worker_id},
            )
        self._report_kept_killing(outcomes)

    def recover_lost_claims(self) -> None:
        """After a claim failed on the database it may still have committed, its
        answer lost with the connection: attempts leased by this worker that it does
        not hold. Recover (re-queue) them now instead of when their lease expires."""
        worker = self._worker
        if not worker.settler.exclusive():
            return  # a settle is under way: next pass
        try:
            # No settle can claim until this one ends: what is held now is all there is.
            held = set(worker.holdings.tokens())

            def recover() -> dict[str, FinishOutcome]:
                return execution.recover_worker(
                    worker.worker_id,
                    keep=held,
                    reason="recovered: claimed as the database failed; never run",
                    now=worker.clock(),
                )

            outcomes = worker.guarded("recovering claims whose answer was lost", recover)
        finally:
            worker.settler.end_exclusive()
        if outcomes is FAILED:
            return
        worker.settler.claims_unknown = False
        if outcomes:
            fault_point("jobs.worker.recovered", count=len(outcomes))
            worker.stats.recovered += len(outcomes)
            worker.emit("recovered", None, f"{len(outcomes)} claim(s) lost with the database")
        self._report_kept_killing(outcomes)

    def _report_kept_killing(self, outcomes: dict[str, FinishOutcome]) -> None:
        """Count and report the recoveries that reached the crash budget (the store
        logs each job, naming it, once its recovery committed)."""
        kept_killing = sum(o is FinishOutcome.KEEPS_KILLING_WORKER for o in outcomes.values())
        if kept_killing:
            worker = self._worker
            worker.stats.kept_killing += kept_killing
            worker.emit(
                FinishOutcome.KEEPS_KILLING_WORKER.value,
                None,
                f"{kept_killing} job(s) ended Interrupted: interrupted "
                f"JOBS['MAX_INTERRUPTIONS'] times, they are not queued again",
            )
