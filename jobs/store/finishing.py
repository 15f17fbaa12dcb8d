"""Finishing an attempt: Running -> Succeeded, Failed, Interrupted or Cancelled, and
the re-queue of automatic retries and recovery (J8, J11)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F

from .. import validation
from ..db import adapt_dt, alias_for, connection_for, fetch
from ..exceptions import (
    AttemptRowMissing,
    InvalidInput,
)
from ..models import Job, JobAttempt
from ..types import (
    AttemptStatus,
    Claim,
    FinishOutcome,
    JobStatus,
)
from . import sql
from .base import check_token, current_time, notify, requeue_fields


def finished_outcomes(
    finishing: Sequence[tuple[Claim, str | None]], rows: list[sql.FinishedRow]
) -> dict[str, FinishOutcome]:
    """Each token's outcome from the rows of a PostgreSQL settle statement.

    A token without a ``'finished'`` row did not finish: STALE. An ``'orphan'`` row
    means a job Running under its token has no Running attempt row; the statement then
    changed nothing, and the whole transition fails with ``AttemptRowMissing``.
    """
    outcomes = {claim.token: FinishOutcome.STALE for claim, _ in finishing}
    for row in rows:
        if row["kind"] == "orphan" or (row["kind"] == "finished" and not row["attempt_finished"]):
            raise AttemptRowMissing()
        if row["kind"] == "finished":
            outcomes[row["token"]] = FinishOutcome(row["status"])
    return outcomes


def complete_rows(
    connection: BaseDatabaseWrapper,
    completions: Sequence[tuple[Claim, str | None]],
    now: datetime,
) -> dict[str, FinishOutcome]:
    """SQLite: ``complete`` for many attempts inside the caller's transaction — two
    statements for the whole batch, each row guarded by its own token (see
    :func:`complete_many`; PostgreSQL uses :func:`sql.complete_ctes`)."""
    outcomes = {claim.token: FinishOutcome.STALE for claim, _ in completions}
    remaining = list(completions)
    now_db = adapt_dt(connection, now)
    while remaining:
        # One identity per statement, so that a returned job row names its token;
        # a repeated identity (two attempts of one job) waits for the next round.
        batch: dict[tuple[str, str], tuple[Claim, str | None]] = {}
        later = []
        for item in remaining:
            key = (item[0].scope_hash, item[0].job_id)
            if key in batch:
                later.append(item)
            else:
                batch[key] = item
        remaining = later
        done = [{"token": claim.token, "result_ref": result} for claim, result in batch.values()]
        finished = fetch(
            connection, sql.complete_jobs(len(done)), {**sql.numbered(done), "now": now_db}
        )
        if not finished:
            continue
        attempts = []
        for row in finished:
            claim, result = batch[(row["scope_hash"], row["job_id"])]
            final = JobStatus(row["status"])
            succeeded = final is JobStatus.SUCCEEDED
            outcomes[claim.token] = FinishOutcome(final.value)
            attempt_status = AttemptStatus.SUCCEEDED if succeeded else AttemptStatus.CANCELLED
            attempts.append(
                {
                    "job_pk": row["id"],
                    "token": claim.token,
                    "status": attempt_status.value,
                    "result_ref": result if succeeded else None,
                }
            )
        updated = fetch(
            connection,
            sql.complete_attempts(len(attempts)),
            {**sql.numbered(attempts), "now": now_db},
        )
        if len(updated) != len(attempts):
            raise AttemptRowMissing()
    return outcomes


_FINISH_STATUS = {
    AttemptStatus.SUCCEEDED: JobStatus.SUCCEEDED,
    AttemptStatus.FAILED: JobStatus.FAILED,
    AttemptStatus.INTERRUPTED: JobStatus.INTERRUPTED,
}


def finish(
    token: str,
    outcome: AttemptStatus,
    *,
    result_ref: str | None = None,
    error: str = "",
    requeue_at: datetime | None = None,
    lease_expired_before: datetime | None = None,
    leased_by: str | None = None,
    now: datetime | None = None,
) -> FinishOutcome:
    """J8/J11: end the current attempt of a Running job, both rows in one transaction.

    The database decides cancel-versus-finish: if a cancel request committed first,
    the job ends Cancelled and any result reference is dropped. With ``requeue_at``,
    a Failed or Interrupted job with attempts left and no cancel request is queued
    again in the same transaction (automatic retry, recovery). ``lease_expired_before``
    and ``leased_by`` narrow the guard so recovery never robs a live worker.
    A stale token changes nothing and returns ``FinishOutcome.STALE``.
    """
    token = check_token(token)
    if outcome not in _FINISH_STATUS:
        raise InvalidInput(f"an attempt cannot finish as {outcome!r}")
    if result_ref is not None:
        result_ref = validation.text(result_ref, "result_ref", validation.MAX_TEXT_LENGTH)
    error = validation.text(error, "error", validation.MAX_TEXT_LENGTH)
    if outcome is not AttemptStatus.SUCCEEDED:
        result_ref = None
    now = current_time(now)
    alias = alias_for(Job)
    connection = connection_for(Job)
    statement = sql.finish_job(
        lease_guard=lease_expired_before is not None, owner_guard=leased_by is not None
    )
    params: dict[str, Any] = {
        "token": token,
        "status": _FINISH_STATUS[outcome].value,
        "result_ref": result_ref,
        "error": error,
        "now": adapt_dt(connection, now),
    }
    if lease_expired_before is not None:
        params["lease_expired_before"] = adapt_dt(connection, lease_expired_before)
    if leased_by is not None:
        params["leased_by"] = leased_by
    with transaction.atomic(using=alias):
        rows = fetch(connection, statement, params)
        if not rows:
            return FinishOutcome.STALE
        [row] = rows
        job_pk, final, queue = row["id"], JobStatus(row["status"]), row["queue"]
        attempt_status = outcome
        if final is JobStatus.CANCELLED and outcome is not AttemptStatus.INTERRUPTED:
            attempt_status = AttemptStatus.CANCELLED
        if not JobAttempt.objects.filter(
            job_id=job_pk, token=token, status=AttemptStatus.RUNNING
        ).update(
            status=attempt_status,
            result_ref=result_ref if final is JobStatus.SUCCEEDED else None,
            error=error,
            finished_at=now,
        ):
            raise AttemptRowMissing()
        if requeue_at is not None and final in (JobStatus.FAILED, JobStatus.INTERRUPTED):
            requeued = Job.objects.filter(
                pk=job_pk,
                status=final,
                cancel_requested=False,
                attempt_count__lt=F("max_attempts"),
            ).update(**{**requeue_fields(requeue_at, now), "error": error})
            if requeued:
                if requeue_at <= now:
                    notify(connection, queue)
                return FinishOutcome.REQUEUED
    return FinishOutcome(final.value)


def recover(
    token: str,
    *,
    requeue: bool = True,
    reason: str = "recovered: the attempt's worker stopped",
    lease_expired_before: datetime | None = None,
    leased_by: str | None = None,
    now: datetime | None = None,
) -> FinishOutcome:
    """J11: end an old attempt as Interrupted and, when allowed, re-queue the job —
    one transaction, so no crash leaves a job interrupted but not re-queued."""
    now = current_time(now)
    return finish(
        token,
        AttemptStatus.INTERRUPTED,
        error=reason,
        requeue_at=now if requeue else None,
        lease_expired_before=lease_expired_before,
        leased_by=leased_by,
        now=now,
    )
