"""Every state transition of jobs and their attempts.

Each transition is one guarded statement — it succeeds only from the states that
allow it — inside ``transaction.atomic``, and returns a typed outcome or raises a
typed error. Nothing else in the app writes to ``jobs_job`` or ``jobs_jobattempt``.

    submit / stage ............ (new) -> QUEUED                      insert_job
    cancel .................... QUEUED -> CANCELLED                  cancel
                                RUNNING -> RUNNING + cancel flag     cancel
    claim / try_start ......... QUEUED -> RUNNING (new token, n+1)   claim
    complete .................. RUNNING -> SUCCEEDED | CANCELLED     finish
    fail ...................... RUNNING -> FAILED | CANCELLED        finish
                                (with retry_at: -> QUEUED)           finish + requeue
    interrupt ................. RUNNING -> INTERRUPTED | CANCELLED   finish
    recover ................... RUNNING -> INTERRUPTED (-> QUEUED)   finish + requeue
    retry ..................... FAILED | CANCELLED | INTERRUPTED -> QUEUED   retry

The trusted executor reaches these through :mod:`jobs.execution`; callers of one
scope through :mod:`jobs.api`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F
from django.utils import timezone

from . import validation
from .conf import jobs_settings
from .db import (
    adapt_dt,
    alias_for,
    connection_for,
    is_postgres,
    placeholders,
    random_token_sql,
    read_dt,
)
from .exceptions import (
    AmbientTransactionError,
    AttemptRowMissing,
    InvalidInput,
    InvalidTransition,
    JobIdentityConflict,
    JobNotFound,
    TransactionRequiredError,
)
from .models import Job, JobAttempt
from .types import (
    RETRYABLE_STATUSES,
    AttemptSnapshot,
    AttemptStatus,
    CancelOutcome,
    Claim,
    DueJob,
    ExecutionStatus,
    FinishOutcome,
    JobSnapshot,
    JobStatus,
    JobSubmission,
)

logger = logging.getLogger(__name__)

JOB = Job._meta.db_table
ATTEMPT = JobAttempt._meta.db_table


def _now(now: datetime | None) -> datetime:
    return timezone.now() if now is None else validation.aware_utc(now, "now")


# --------------------------------------------------------------------------- reads


def snapshot(job: Job, *, created: bool = False, with_attempts: bool = False) -> JobSnapshot:
    attempts: tuple[AttemptSnapshot, ...] = ()
    if with_attempts:
        attempts = tuple(
            AttemptSnapshot(
                number=a.number,
                status=AttemptStatus(a.status),
                worker_id=a.worker_id,
                progress=a.progress,
                progress_message=a.progress_message,
                error=a.error,
                result_ref=a.result_ref,
                started_at=a.started_at,
                finished_at=a.finished_at,
            )
            for a in JobAttempt.objects.filter(job=job).order_by("number")
        )
    return JobSnapshot(
        scope_hash=job.scope_hash,
        job_id=job.job_id,
        handler=job.handler,
        handler_version=job.handler_version,
        payload_json=job.payload_json,
        queue=job.queue,
        priority=job.priority,
        max_attempts=job.max_attempts,
        initial_not_before=job.initial_not_before,
        next_run_at=job.next_run_at,
        status=JobStatus(job.status),
        attempt_count=job.attempt_count,
        cancel_requested=job.cancel_requested,
        progress=job.progress,
        progress_message=job.progress_message,
        error=job.error,
        result_ref=job.result_ref,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        created=created,
        attempts=attempts,
    )


def get(scope_hash: str, job_id: str, *, with_attempts: bool = True) -> JobSnapshot | None:
    job = Job.objects.for_scope(scope_hash).filter(job_id=job_id).first()
    return None if job is None else snapshot(job, with_attempts=with_attempts)


def list_jobs(
    scope_hash: str,
    *,
    status: JobStatus | str | Iterable[JobStatus | str] | None = None,
    queue: str | None = None,
    handler: str | None = None,
    limit: int | None = None,
) -> list[JobSnapshot]:
    """Every matching job of one scope, oldest first; ``limit`` caps the count."""
    qs = Job.objects.for_scope(scope_hash)
    if status is not None:
        wanted = [status] if isinstance(status, str) else list(status)
        for value in wanted:
            if value not in JobStatus.values:
                raise InvalidInput(f"unknown job status {value!r}")
        qs = qs.filter(status__in=wanted)
    if queue is not None:
        qs = qs.filter(queue=queue)
    if handler is not None:
        qs = qs.filter(handler=handler)
    qs = qs.order_by("created_at", "id")
    if limit is not None:
        validation.integer(limit, "limit", 0, 10**9)
        qs = qs[:limit]
    return [snapshot(job) for job in qs]


def get_due(
    *, limit: int = 100, queues: Sequence[str] | None = None, now: datetime | None = None
) -> list[DueJob]:
    """Due candidates across scopes, by priority (highest first) then time. Grants nothing."""
    validation.integer(limit, "limit", 0, 10_000)
    qs = Job.objects.due(_now(now))
    if queues:
        qs = qs.filter(queue__in=list(queues))
    rows = qs.order_by("-priority", "next_run_at", "id").values_list(
        "scope_hash", "job_id", "queue", "priority", "next_run_at", "handler", "handler_version"
    )[:limit]
    return [
        DueJob(
            scope_hash=r[0],
            job_id=r[1],
            queue=r[2],
            priority=r[3],
            next_run_at=r[4],
            handler=r[5],
            handler_version=r[6],
        )
        for r in rows
    ]


# --------------------------------------------------------------------------- creation


def _notify(connection: BaseDatabaseWrapper, queue: str) -> None:
    """Wake PostgreSQL workers. Sent inside the writing transaction: delivered on commit."""
    if is_postgres(connection):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [jobs_settings().NOTIFY_CHANNEL, queue])


def _insert_sql() -> str:
    return (
        f"INSERT INTO {JOB} (scope_hash, job_id, handler, handler_version, payload_json,"
        " queue, priority, max_attempts, initial_not_before, next_run_at, status,"
        " attempt_count, cancel_requested, progress_message, error, leased_by,"
        " created_at, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, %s, '', '', '', %s, %s)"
        " ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING id"
    )


def _new_snapshot(scope_hash: str, job_id: str, sub: JobSubmission, now: datetime) -> JobSnapshot:
    return JobSnapshot(
        scope_hash=scope_hash,
        job_id=job_id,
        handler=sub.handler,
        handler_version=sub.handler_version,
        payload_json=sub.payload_json,
        queue=sub.queue,
        priority=sub.priority,
        max_attempts=sub.max_attempts,
        initial_not_before=sub.initial_not_before,
        next_run_at=sub.initial_not_before or now,
        status=JobStatus.QUEUED,
        attempt_count=0,
        cancel_requested=False,
        progress=None,
        progress_message="",
        error="",
        result_ref=None,
        created_at=now,
        started_at=None,
        finished_at=None,
        created=True,
    )


def _insert(scope_hash: str, job_id: str, sub: JobSubmission, now: datetime) -> JobSnapshot | None:
    """Insert a new Queued job in the current transaction; None if the identity exists.

    ``ON CONFLICT DO NOTHING`` waits for a concurrent inserter of the same identity
    and then yields to it, so a race never aborts the surrounding transaction.
    """
    connection = connection_for(Job)
    run_at = sub.initial_not_before or now
    params = [
        scope_hash,
        job_id,
        sub.handler,
        sub.handler_version,
        sub.payload_json,
        sub.queue,
        sub.priority,
        sub.max_attempts,
        adapt_dt(connection, sub.initial_not_before),
        adapt_dt(connection, run_at),
        JobStatus.QUEUED.value,
        False,
        adapt_dt(connection, now),
        adapt_dt(connection, now),
    ]
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(), params)
        inserted = cursor.fetchone() is not None
    if not inserted:
        return None
    if run_at <= now:
        _notify(connection, sub.queue)
    return _new_snapshot(scope_hash, job_id, sub, now)


def _existing_or_conflict(scope_hash: str, job_id: str, sub: JobSubmission) -> JobSnapshot | None:
    """The stored job if it is the same request; JobIdentityConflict if it differs."""
    job = Job.objects.for_scope(scope_hash).filter(job_id=job_id).first()
    if job is None:
        return None
    existing = snapshot(job)
    differing = existing.submission().differing_fields(sub)
    if differing:
        raise JobIdentityConflict(job_id, differing)
    return existing


def _in_caller_atomic_block(connection: BaseDatabaseWrapper) -> bool:
    """Whether the caller has an ``atomic`` block open on ``connection``.

    The blocks Django's ``TestCase`` (and pytest-django's ``django_db``) wrap around
    each test do not count, exactly as for ``atomic(durable=True)``: code that calls
    ``submit_job`` or ``stage_job`` behaves in an ordinary test as in production.
    """
    return any(not block._from_testcase for block in connection.atomic_blocks)  # type: ignore[attr-defined]


def submit(
    scope_hash: str, job_id: str, sub: JobSubmission, *, now: datetime | None = None
) -> JobSnapshot:
    """J3: create the job in a short transaction of its own (idempotent per identity)."""
    alias = alias_for(Job)
    if _in_caller_atomic_block(transaction.get_connection(alias)):
        raise AmbientTransactionError()
    now = _now(now)
    for _ in range(3):
        with transaction.atomic(using=alias):
            created = _insert(scope_hash, job_id, sub, now)
            if created is not None:
                return created
            existing = _existing_or_conflict(scope_hash, job_id, sub)
            if existing is not None:
                return existing
        # The conflicting row vanished between the insert and the read (deleted by
        # retention); insert again.
    raise IntegrityError(f"job {job_id!r}: identity conflict without a visible winner")


def stage(
    scope_hash: str, job_id: str, sub: JobSubmission, *, now: datetime | None = None
) -> JobSnapshot:
    """J4: create the job inside the caller's open transaction, on its connection.

    Never commits and never uses a savepoint. On a conflicting request or any
    database error, the caller's transaction is marked for rollback before the error
    propagates, so the business work cannot commit without its job.
    """
    alias = alias_for(Job)
    connection = transaction.get_connection(alias)
    if not _in_caller_atomic_block(connection):
        raise TransactionRequiredError()
    now = _now(now)
    try:
        created = _insert(scope_hash, job_id, sub, now)
        if created is not None:
            return created
        existing = _existing_or_conflict(scope_hash, job_id, sub)
    except (JobIdentityConflict, DatabaseError):
        transaction.set_rollback(True, using=alias)
        raise
    if existing is None:
        transaction.set_rollback(True, using=alias)
        raise IntegrityError(f"job {job_id!r}: identity conflict without a visible winner")
    return existing


# --------------------------------------------------------------------------- scoped transitions


def cancel(scope_hash: str, job_id: str, *, now: datetime | None = None) -> CancelOutcome:
    """J9: Queued -> Cancelled at once; Running -> cancel flag; finished -> said so."""
    now = _now(now)
    alias = alias_for(Job)
    jobs = Job.objects.for_scope(scope_hash).filter(job_id=job_id)
    with transaction.atomic(using=alias):
        # A job can move from Queued to Running between the two updates; the loop
        # re-reads and tries again, so the outcome always matches the stored state.
        for _ in range(5):
            if jobs.filter(status=JobStatus.QUEUED).update(
                status=JobStatus.CANCELLED, finished_at=now, updated_at=now
            ):
                return CancelOutcome.CANCELLED
            if jobs.filter(status=JobStatus.RUNNING).update(cancel_requested=True, updated_at=now):
                _notify_cancel(connection_for(Job))
                return CancelOutcome.REQUESTED
            status = jobs.values_list("status", flat=True).first()
            if status is None:
                raise JobNotFound()
            if JobStatus(status).is_finished:
                return CancelOutcome.ALREADY_FINISHED
    raise InvalidTransition(f"job {job_id!r} kept changing state; cancel again")


def _notify_cancel(connection: BaseDatabaseWrapper) -> None:
    if is_postgres(connection):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, %s)", [jobs_settings().NOTIFY_CHANNEL + "_cancel", ""]
            )


def _requeue_fields(run_at: datetime, now: datetime) -> dict[str, Any]:
    return {
        "status": JobStatus.QUEUED,
        "next_run_at": run_at,
        "progress": None,
        "progress_message": "",
        "error": "",
        "cancel_requested": False,
        "result_ref": None,
        "current_token": None,
        "leased_by": "",
        "lease_expires_at": None,
        "started_at": None,
        "finished_at": None,
        "updated_at": now,
    }


def retry(
    scope_hash: str,
    job_id: str,
    *,
    not_before: datetime | None = None,
    now: datetime | None = None,
) -> JobSnapshot:
    """J10: Failed, Cancelled or Interrupted with attempts left -> Queued.

    Earlier attempts stay; progress, error, cancel flag, result and token are cleared.
    """
    now = _now(now)
    run_at = validation.optional_aware_utc(not_before, "not_before") or now
    alias = alias_for(Job)
    jobs = Job.objects.for_scope(scope_hash).filter(job_id=job_id)
    with transaction.atomic(using=alias):
        updated = jobs.filter(
            status__in=RETRYABLE_STATUSES, attempt_count__lt=F("max_attempts")
        ).update(**_requeue_fields(run_at, now))
        job = jobs.first()
        if job is None:
            raise JobNotFound()
        if not updated:
            if job.status in RETRYABLE_STATUSES:
                raise InvalidTransition(
                    f"job {job_id!r} has no attempts left "
                    f"({job.attempt_count} of {job.max_attempts} used)"
                )
            raise InvalidTransition(
                f"job {job_id!r} is {job.status}; only failed, cancelled or "
                "interrupted jobs can be retried"
            )
        if run_at <= now:
            _notify(connection_for(Job), job.queue)
    return snapshot(job)


# --------------------------------------------------------------------------- execution


def _claim_sql(connection: BaseDatabaseWrapper, *, queues: int, one_job: bool) -> str:
    filters = [
        "status = %s",
        "cancel_requested = %s",
        "next_run_at <= %s",
        "attempt_count < max_attempts",
    ]
    if queues:
        filters.append(f"queue IN ({placeholders(queues)})")
    if one_job:
        filters.append("scope_hash = %s AND job_id = %s")
    lock = " FOR UPDATE SKIP LOCKED" if is_postgres(connection) else ""
    return (
        f"UPDATE {JOB} SET status = %s, attempt_count = attempt_count + 1,"
        f" current_token = {random_token_sql(connection)},"
        " leased_by = %s, lease_expires_at = %s, started_at = %s, updated_at = %s,"
        " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
        " finished_at = NULL"
        f" WHERE id IN (SELECT id FROM {JOB} WHERE {' AND '.join(filters)}"
        f" ORDER BY priority DESC, next_run_at, id LIMIT %s{lock})"
        " RETURNING id, scope_hash, job_id, current_token, attempt_count, max_attempts,"
        " handler, handler_version, payload_json, queue, priority, next_run_at"
    )


def claim(
    worker_id: str,
    *,
    limit: int,
    queues: Sequence[str] | None = None,
    lease_seconds: float | None = None,
    identity: tuple[str, str] | None = None,
    now: datetime | None = None,
) -> list[Claim]:
    """J6: start up to ``limit`` due jobs in one transaction; each gets a new token.

    Per job it is the same guarded change as ``try_start``: Queued, no cancel
    requested, due, attempts left -> Running with attempt n+1 and its Running
    attempt row; both or neither. On PostgreSQL, ``SKIP LOCKED`` lets many workers
    claim from one queue without waiting for each other.
    """
    worker_id = validation.text(worker_id, "worker_id", validation.MAX_NAME_LENGTH)
    validation.integer(limit, "limit", 1, 10_000)
    now = _now(now)
    lease = timedelta(seconds=lease_seconds or jobs_settings().LEASE_SECONDS)
    expires = now + lease
    queue_list = list(queues or [])
    alias = alias_for(Job)
    connection = connection_for(Job)
    params: list[Any] = [
        JobStatus.RUNNING.value,
        worker_id,
        adapt_dt(connection, expires),
        adapt_dt(connection, now),
        adapt_dt(connection, now),
        JobStatus.QUEUED.value,
        False,
        adapt_dt(connection, now),
        *queue_list,
    ]
    if identity is not None:
        params.extend(identity)
    params.append(limit)
    sql = _claim_sql(connection, queues=len(queue_list), one_job=identity is not None)
    with transaction.atomic(using=alias):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if not rows:
            return []
        rows.sort(key=lambda r: (-r[10], read_dt(r[11]), r[0]))
        JobAttempt.objects.using(alias).bulk_create(
            [
                JobAttempt(
                    job_id=r[0],
                    number=r[4],
                    token=r[3],
                    status=AttemptStatus.RUNNING,
                    worker_id=worker_id,
                    started_at=now,
                )
                for r in rows
            ]
        )
    return [
        Claim(
            scope_hash=r[1],
            job_id=r[2],
            token=r[3],
            attempt=r[4],
            max_attempts=r[5],
            handler=r[6],
            handler_version=r[7],
            payload_json=r[8],
            queue=r[9],
            worker_id=worker_id,
            lease_expires_at=expires,
        )
        for r in rows
    ]


def _check_token(token: object) -> str:
    if not isinstance(token, str) or not token or len(token) > 64:
        raise InvalidInput("token must be a non-empty str of at most 64 characters")
    return token


def report_progress(
    token: str, value: float, message: str | None = None, *, now: datetime | None = None
) -> bool:
    """J7: record progress for the current attempt of a Running job.

    Only when the token is current, no cancel is requested and ``value`` is not
    below the stored value; the attempt row changes in the same transaction.
    Returns False, changing nothing, in every other case.
    """
    token = _check_token(token)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"progress must be a finite number, got {value!r}")
    if not 0 <= value <= 100:
        raise InvalidInput(f"progress is a percentage between 0 and 100, got {value!r}")
    text = "" if message is None else validation.text(message, "progress message", 10_000)
    now = _now(now)
    alias = alias_for(Job)
    connection = connection_for(Job)
    with transaction.atomic(using=alias):
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {JOB} SET progress = %s, progress_message = %s, updated_at = %s"
                " WHERE current_token = %s AND status = %s AND cancel_requested = %s"
                " AND (progress IS NULL OR progress <= %s) RETURNING id",
                [
                    float(value),
                    text,
                    adapt_dt(connection, now),
                    token,
                    JobStatus.RUNNING.value,
                    False,
                    float(value),
                ],
            )
            row = cursor.fetchone()
        if row is None:
            logger.debug("progress not recorded: token not current, cancelled or lower value")
            return False
        if not JobAttempt.objects.filter(
            job_id=row[0], token=token, status=AttemptStatus.RUNNING
        ).update(progress=float(value), progress_message=text):
            raise AttemptRowMissing()
    return True


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
    token = _check_token(token)
    if outcome not in _FINISH_STATUS:
        raise InvalidInput(f"an attempt cannot finish as {outcome!r}")
    if result_ref is not None:
        result_ref = validation.text(result_ref, "result_ref", validation.MAX_TEXT_LENGTH)
    error = validation.text(error, "error", validation.MAX_TEXT_LENGTH)
    if outcome is not AttemptStatus.SUCCEEDED:
        result_ref = None
    now = _now(now)
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
            ).update(**{**_requeue_fields(requeue_at, now), "error": error})
            if requeued:
                if requeue_at <= now:
                    _notify(connection, queue)
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
    now = _now(now)
    return finish(
        token,
        AttemptStatus.INTERRUPTED,
        error=reason,
        requeue_at=now if requeue else None,
        lease_expired_before=lease_expired_before,
        leased_by=leased_by,
        now=now,
    )


def heartbeat(
    tokens: Sequence[str],
    worker_id: str,
    *,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> dict[str, ExecutionStatus]:
    """Renew the leases of a worker's running attempts; report each token's status.

    A token missing from the renewal (finished, recovered by another worker) is
    ENDED: its handler must stop.
    """
    if not tokens:
        return {}
    now = _now(now)
    expires = now + timedelta(seconds=lease_seconds or jobs_settings().LEASE_SECONDS)
    alias = alias_for(Job)
    connection = connection_for(Job)
    token_list = [_check_token(t) for t in tokens]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB} SET lease_expires_at = %s"
            f" WHERE status = %s AND leased_by = %s"
            f" AND current_token IN ({placeholders(len(token_list))})"
            " RETURNING current_token, cancel_requested",
            [
                adapt_dt(connection, expires),
                JobStatus.RUNNING.value,
                worker_id,
                *token_list,
            ],
        )
        rows = cursor.fetchall()
    states = {t: ExecutionStatus.ENDED for t in token_list}
    for current, cancel_requested in rows:
        states[current] = (
            ExecutionStatus.CANCEL_REQUESTED if cancel_requested else ExecutionStatus.ACTIVE
        )
    return states


def execution_statuses(tokens: Sequence[str]) -> dict[str, ExecutionStatus]:
    """J12 for many tokens at once; reads the job row's state only, never the payload."""
    token_list = [_check_token(t) for t in tokens]
    states = {t: ExecutionStatus.ENDED for t in token_list}
    if not token_list:
        return states
    rows = Job.objects.filter(current_token__in=token_list, status=JobStatus.RUNNING).values_list(
        "current_token", "cancel_requested"
    )
    for current, cancel_requested in rows:
        if current is not None:
            states[current] = (
                ExecutionStatus.CANCEL_REQUESTED if cancel_requested else ExecutionStatus.ACTIVE
            )
    return states


def expired_tokens(*, now: datetime | None = None, limit: int = 100) -> list[str]:
    """Tokens of Running attempts whose lease has expired (their worker is gone)."""
    now = _now(now)
    return [
        t
        for t in Job.objects.lease_expired(now)
        .order_by("lease_expires_at")
        .values_list("current_token", flat=True)[:limit]
        if t is not None
    ]


def tokens_leased_by(worker_id: str) -> list[str]:
    """Tokens of Running attempts leased by ``worker_id`` (a restarted worker's own)."""
    return [
        t
        for t in Job.objects.running()
        .filter(leased_by=worker_id)
        .values_list("current_token", flat=True)
        if t is not None
    ]
