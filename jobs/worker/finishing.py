"""The finisher: writes one attempt's end on its own (a failure, a put-back, a
snooze, a release, a success outside a settle) and records every end the worker
wrote — counts, the log line, the ``finished_attempt`` signal, the event."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ledon.db import DATABASE_ERRORS
from ledon.faults import fault_point

from .. import execution
from ..observability.log_fields import attempt_fields
from ..signals import finished_attempt
from ..types import Claim, FinishOutcome
from .interfaces import WorkerInterface

logger = logging.getLogger("jobs.worker")

#: Outcomes that name their own event (whatever the worker expected).
_OWN_EVENT = frozenset(
    {
        FinishOutcome.CANCELLED,
        FinishOutcome.STALE,
        FinishOutcome.PUT_BACK,
        FinishOutcome.SNOOZED,
        FinishOutcome.RELEASED,
        FinishOutcome.KEEPS_KILLING_WORKER,
    }
)


class Finisher:
    """Writes and records attempts' ends for ``worker``."""

    def __init__(self, worker: WorkerInterface) -> None:
        self._worker = worker

    def committed[T](self, call: Callable[[], T], *, one_statement: bool = False) -> T:
        """Run the worker's own claim or finish ``call``: with
        ``JOBS["ASYNCHRONOUS_COMMIT"]`` on PostgreSQL, its commit does not wait for
        the WAL flush (``one_statement``: ``call`` is one statement in autocommit)."""
        if not self._worker.settings.ASYNCHRONOUS_COMMIT:
            return call()
        with execution.asynchronous_commit(True, one_statement=one_statement):
            return call()

    def finish(
        self, claim: Claim, event: str, call: Callable[[], FinishOutcome], detail: str = ""
    ) -> FinishOutcome | None:
        """Write the attempt's end, retrying with the engine's back-off while the
        database is unreachable (other database errors a few times). If it gives up
        — another error, or the worker aborts — the lease expires and another worker
        recovers the attempt; then None."""
        try:
            outcome = self._worker.retry_database(
                f"finishing job {claim.job_id}", lambda: self.committed(call)
            )
        except DATABASE_ERRORS:
            logger.warning(
                "finishing job %s failed; it is recovered when its lease expires",
                claim.job_id,
                extra=attempt_fields(claim),
            )
            return None
        fault_point("jobs.worker.finished", job_id=claim.job_id, outcome=outcome.value)
        self.record(claim, event, outcome, detail)
        return outcome

    def record(self, claim: Claim, event: str, outcome: FinishOutcome, detail: str = "") -> None:
        """Count, log, signal and report an end that is committed."""
        worker = self._worker
        with worker.holdings.lock:
            if outcome is FinishOutcome.REQUEUED and event == "failed":
                worker.stats.retried += 1
                event = "retry-scheduled"
            else:
                worker.stats.count(outcome)
                if outcome in _OWN_EVENT:
                    event = outcome.value
        if logger.isEnabledFor(logging.INFO):  # its fields are not built for nothing
            logger.info(
                "job %s %s",
                claim.job_id,
                event,
                extra=attempt_fields(claim, now=worker.clock(), outcome=outcome.value, event=event),
            )
        finished_attempt(claim, outcome, retry_scheduled=event == "retry-scheduled")
        worker.emit(event, claim, detail)
