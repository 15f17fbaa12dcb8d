"""Recovery: an attempt no worker runs any more — its worker died (its lease expired,
or it restarted under the same id) or outlived its shutdown's grace — ends
Interrupted, and the job is queued again under the crash budget.

The crash budget: such an attempt uses none of the job's ``max_attempts``. In one
guarded statement (the token current, the job Running, and recovery's own guards)
the attempt count goes back down and the job's ``interruption_count`` up; while that
count stays below ``JOBS["MAX_INTERRUPTIONS"]`` the job is Queued again at once, and
the interruption that reaches it ends the job Interrupted as one that keeps killing
its worker (``keeps_killing_worker``), which is logged and signalled once it commits.
The attempt row ends Interrupted in the same transaction. A cancel request that
committed first ends the job Cancelled, as a finish would; a stale token changes
nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from ledon.db import adapt_dt, alias_for, connection_for

from .. import validation
from ..conf import jobs_settings
from ..db import fetch
from ..exceptions import AttemptRowMissing
from ..models import Job
from ..signals import kept_killing_worker
from ..types import AttemptStatus, FinishOutcome, JobStatus
from . import sql_flow
from .base import check_token, current_time, notify
from .endings import run_moving
from .finishing import finish, give_back

logger = logging.getLogger(__name__)

#: What a recovery says when its caller gives no reason.
STOPPED = "recovered: the attempt's worker stopped"


def recover(
    token: str,
    *,
    requeue: bool = True,
    reason: str = STOPPED,
    lease_expired_before: datetime | None = None,
    leased_by: str | None = None,
    now: datetime | None = None,
) -> FinishOutcome:
    """End the old attempt under ``token`` as Interrupted, its job as the crash budget
    says, in one transaction: ``REQUEUED`` (Queued again at once, the attempt
    unused), ``KEEPS_KILLING_WORKER`` (the interruption that reached
    ``JOBS["MAX_INTERRUPTIONS"]``: Interrupted for good) or ``CANCELLED`` (a cancel
    request committed first). ``lease_expired_before`` and ``leased_by`` narrow the
    guard so that recovery never robs a live worker; a token they do not admit, or
    that is not current, changes nothing (``STALE``).

    Without ``requeue`` the attempt ends as :func:`~jobs.store.finish` interrupts it:
    the job Interrupted (or Cancelled), the attempt counted, nothing queued again."""
    if not requeue:
        return finish(
            token,
            AttemptStatus.INTERRUPTED,
            error=reason,
            lease_expired_before=lease_expired_before,
            leased_by=leased_by,
            now=now,
        )
    token = check_token(token)
    reason = validation.text(reason, "reason", validation.MAX_TEXT_LENGTH)
    now = current_time(now)
    budget = jobs_settings().MAX_INTERRUPTIONS
    connection = connection_for(Job)
    params: dict[str, Any] = {
        "token": token,
        "now": adapt_dt(connection, now),
        "reason": reason,
        "max_interruptions": budget,
        "summary": validation.job_error_summary(reason),
        "spent": validation.job_error_summary(
            f"keeps killing its worker: interrupted {budget} times or more "
            f"(JOBS['MAX_INTERRUPTIONS']); the last time: {reason}"
        ),
    }
    if lease_expired_before is not None:
        params["lease_expired_before"] = adapt_dt(connection, lease_expired_before)
    if leased_by is not None:
        params["leased_by"] = leased_by
    statement = sql_flow.recover_job(
        lease_guard=lease_expired_before is not None, owner_guard=leased_by is not None
    )
    alias = alias_for(Job)
    with transaction.atomic(using=alias):
        # Interrupted for good or Cancelled is final: what follows in its batch and
        # sequence too (Queued again is not).
        rows = run_moving(connection, statement, params, now, was=JobStatus.RUNNING.value)
        if not rows:
            return FinishOutcome.STALE
        job = rows[0]
        if not fetch(connection, sql_flow.RECOVER_ATTEMPT, {**params, "job": job["id"]}):
            raise AttemptRowMissing()
        give_back(connection, job["limit_keys"])
        status = JobStatus(job["status"])
        if status is JobStatus.QUEUED:
            notify(connection, job["queue"])
            return FinishOutcome.REQUEUED
        if status is JobStatus.CANCELLED:
            return FinishOutcome.CANCELLED
        summary = params["summary"]
        transaction.on_commit(
            lambda: _kept_killing(job, reason=summary, budget=budget), using=alias
        )
    return FinishOutcome.KEEPS_KILLING_WORKER


def _kept_killing(job: dict[str, Any], *, reason: str, budget: int) -> None:
    """Say that the job of ``job`` (a row of :func:`sql_flow.recover_job`) ended
    Interrupted as one that keeps killing its worker: in the log, and to
    :data:`jobs.signals.job_keeps_killing_worker` (the metrics count it)."""
    logger.error(
        "job %s keeps killing its worker: interrupted %d times (JOBS['MAX_INTERRUPTIONS'] "
        "is %d), it ended Interrupted and is not queued again; the last time: %s",
        job["job_id"],
        job["interruption_count"],
        budget,
        reason,
        extra={
            "job_id": job["job_id"],
            "scope_hash": job["scope_hash"],
            "handler": job["handler"],
            "queue": job["queue"],
            "interruptions": job["interruption_count"],
            "max_interruptions": budget,
            "reason": reason,
        },
    )
    kept_killing_worker(
        scope_hash=job["scope_hash"],
        job_id=job["job_id"],
        handler=job["handler"],
        queue=job["queue"],
        interruptions=job["interruption_count"],
    )
