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
from ..db import (
    adapt_dt,
    alias_for,
    connection_for,
)
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
from .base import ATTEMPT, JOB, check_token, current_time, notify, requeue_fields


def finish_ctes() -> str:
    """PostgreSQL: ``complete`` of a batch of attempts as CTEs. Parameters: the tokens
    and their result references as two arrays, the tokens again, the time twice, the
    tokens again, and the time.

    Per row, the guard of :func:`finish` — the token is current and the job Running;
    the job row's own cancel flag decides Succeeded or Cancelled — plus the attempt
    row, which changes in the same statement. ``orphans`` are the tokens whose job is
    Running under them but whose Running attempt row is missing: if there is one,
    nothing in the statement changes anything (J8: the whole transition fails). The
    batch travels as arrays, so the statement's text is the same whatever its size
    and is prepared once; the tokens travel again as a plain array, which a plan can
    look up in the token index whatever its row estimate for the unnest.
    """
    running = JobStatus.RUNNING.value
    return (
        "done AS (SELECT * FROM unnest(%s::text[], %s::text[]) AS d(token, result_ref)),"
        f" orphans AS (SELECT done.token FROM done JOIN {JOB} AS j"
        " ON j.current_token = done.token"
        f" WHERE j.current_token = ANY(%s::text[]) AND j.status = '{running}'"
        f" AND NOT EXISTS (SELECT 1 FROM {ATTEMPT} AS a WHERE a.job_id = j.id"
        f" AND a.token = done.token AND a.status = '{running}')),"
        f" finished AS (UPDATE {JOB} AS j SET"
        f" status = CASE WHEN j.cancel_requested THEN '{JobStatus.CANCELLED.value}'"
        f" ELSE '{JobStatus.SUCCEEDED.value}' END,"
        " result_ref = CASE WHEN j.cancel_requested THEN NULL ELSE done.result_ref END,"
        " error = '', finished_at = %s, updated_at = %s,"
        " current_token = NULL, leased_by = '', lease_expires_at = NULL"
        f" FROM done, {ATTEMPT} AS a"
        f" WHERE j.current_token = ANY(%s::text[]) AND j.current_token = done.token"
        f" AND j.status = '{running}'"
        f" AND a.job_id = j.id AND a.token = done.token AND a.status = '{running}'"
        " AND NOT EXISTS (SELECT 1 FROM orphans)"
        " RETURNING j.id, done.token, j.status, j.result_ref),"
        f" finished_attempts AS (UPDATE {ATTEMPT} AS a SET status = finished.status,"
        " result_ref = finished.result_ref, error = '', finished_at = %s"
        f" FROM finished WHERE a.job_id = finished.id AND a.token = finished.token"
        f" AND a.status = '{running}' RETURNING a.token)"
    )


def finished_outcomes(
    finishing: Sequence[tuple[Claim, str | None]], rows: list[Any]
) -> dict[str, FinishOutcome]:
    """Each token's outcome from the rows of a PostgreSQL settle statement.

    A token without an ``'f'`` row did not finish: STALE. An ``'m'`` row means a job
    Running under its token has no Running attempt row; the statement then changed
    nothing, and the whole transition fails with ``AttemptRowMissing``.
    """
    outcomes = {claim.token: FinishOutcome.STALE for claim, _ in finishing}
    for kind, token, status, attempt_updated, *_ in rows:
        if kind == "m" or (kind == "f" and not attempt_updated):
            raise AttemptRowMissing()
        if kind == "f":
            outcomes[token] = FinishOutcome(status)
    return outcomes


def _complete_sql(rows: int) -> str:
    # Per row, the same guard as ``finish``: the token is current and the job Running;
    # the database decides cancel-versus-finish with the job row's own flag.
    return (
        f"UPDATE {JOB} SET"
        " status = CASE WHEN cancel_requested THEN %s ELSE %s END,"
        " result_ref = CASE WHEN cancel_requested THEN NULL ELSE v.column2 END,"
        " error = '', finished_at = %s, updated_at = %s,"
        " current_token = NULL, leased_by = '', lease_expires_at = NULL"
        f" FROM (VALUES {', '.join(['(%s, %s)'] * rows)}) AS v"
        f" WHERE {JOB}.current_token = v.column1 AND {JOB}.status = %s"
        f" RETURNING {JOB}.id, {JOB}.scope_hash, {JOB}.job_id, {JOB}.status"
    )


def _complete_attempts_sql(rows: int) -> str:
    return (
        f"UPDATE {ATTEMPT} SET status = v.column3, result_ref = v.column4, error = '',"
        " finished_at = %s"
        f" FROM (VALUES {', '.join(['(%s, %s, %s, %s)'] * rows)}) AS v"
        f" WHERE {ATTEMPT}.job_id = v.column1 AND {ATTEMPT}.token = v.column2"
        f" AND {ATTEMPT}.status = %s"
        f" RETURNING {ATTEMPT}.token"
    )


def complete_rows(
    connection: BaseDatabaseWrapper,
    completions: Sequence[tuple[Claim, str | None]],
    now: datetime,
) -> dict[str, FinishOutcome]:
    """SQLite: ``complete`` for many attempts inside the caller's transaction — two
    statements for the whole batch, each row guarded by its own token (see
    :func:`complete_many`; PostgreSQL uses :func:`finish_ctes`)."""
    outcomes = {claim.token: FinishOutcome.STALE for claim, _ in completions}
    remaining = list(completions)
    now_db = adapt_dt(connection, now)
    with connection.cursor() as cursor:
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
            cursor.execute(
                _complete_sql(len(batch)),
                [
                    JobStatus.CANCELLED.value,
                    JobStatus.SUCCEEDED.value,
                    now_db,
                    now_db,
                    *[value for claim, result in batch.values() for value in (claim.token, result)],
                    JobStatus.RUNNING.value,
                ],
            )
            finished = cursor.fetchall()
            if not finished:
                continue
            attempt_rows = []
            for job_pk, scope_hash, job_id, status in finished:
                claim, result = batch[(scope_hash, job_id)]
                final = JobStatus(status)
                succeeded = final is JobStatus.SUCCEEDED
                outcomes[claim.token] = FinishOutcome(final.value)
                attempt_rows.append(
                    (
                        job_pk,
                        claim.token,
                        AttemptStatus.SUCCEEDED.value
                        if succeeded
                        else AttemptStatus.CANCELLED.value,
                        result if succeeded else None,
                    )
                )
            cursor.execute(
                _complete_attempts_sql(len(attempt_rows)),
                [
                    now_db,
                    *[value for row in attempt_rows for value in row],
                    AttemptStatus.RUNNING.value,
                ],
            )
            if len(cursor.fetchall()) != len(attempt_rows):
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
    job_status = _FINISH_STATUS[outcome]
    guards = ["current_token = %s", "status = %s"]
    guard_params: list[Any] = [token, JobStatus.RUNNING.value]
    if lease_expired_before is not None:
        guards.append("lease_expires_at < %s")
        guard_params.append(adapt_dt(connection, lease_expired_before))
    if leased_by is not None:
        guards.append("leased_by = %s")
        guard_params.append(leased_by)
    with transaction.atomic(using=alias):
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {JOB} SET"
                " status = CASE WHEN cancel_requested THEN %s ELSE %s END,"
                " result_ref = CASE WHEN cancel_requested THEN NULL ELSE %s END,"
                " error = %s, finished_at = %s, updated_at = %s,"
                " current_token = NULL, leased_by = '', lease_expires_at = NULL"
                f" WHERE {' AND '.join(guards)}"
                " RETURNING id, status, queue",
                [
                    JobStatus.CANCELLED.value,
                    job_status.value,
                    result_ref,
                    error,
                    adapt_dt(connection, now),
                    adapt_dt(connection, now),
                    *guard_params,
                ],
            )
            row = cursor.fetchone()
        if row is None:
            return FinishOutcome.STALE
        job_pk, final, queue = row[0], JobStatus(row[1]), row[2]
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
