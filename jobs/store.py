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
    unknown handler (J19) ..... RUNNING -> QUEUED later | FAILED | CANCELLED,
                                the claim uncounted                  put_back_unknown_handler
    recover ................... RUNNING -> INTERRUPTED (-> QUEUED)   finish + requeue
    retry ..................... FAILED | CANCELLED | INTERRUPTED -> QUEUED   retry
    purge_finished ............ finished, older than a cutoff -> (deleted)   retention

The trusted executor reaches these through :mod:`jobs.execution`; callers of one
scope through :mod:`jobs.api`.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
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
    fetch,
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
    FINISHED_STATUSES,
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
    SubmitResult,
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


_JOB_COLUMNS = (
    "scope_hash, job_id, handler, handler_version, payload_json, queue, priority,"
    " max_attempts, initial_not_before, next_run_at, status, attempt_count,"
    " cancel_requested, progress_message, error, leased_by, created_at, updated_at"
)
_JOB_VALUES = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, %s, '', '', '', %s, %s)"

#: Rows per INSERT statement of a bulk submit (14 parameters each; SQLite accepts
#: 32,766 parameters per statement).
_INSERT_CHUNK = 500


@functools.lru_cache(maxsize=64)
def _insert_sql(rows: int, *, notify: bool) -> str:
    """``INSERT … ON CONFLICT DO NOTHING`` of ``rows`` jobs, returning each new identity.

    With ``notify`` (PostgreSQL, due jobs), the same statement also sends the wake-up
    (its last parameter is the channel): a single submit is one round trip, and the
    notification is delivered when the statement's transaction commits.
    """
    insert = (
        f"INSERT INTO {JOB} ({_JOB_COLUMNS}) VALUES {', '.join([_JOB_VALUES] * rows)}"
        " ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING scope_hash, job_id, queue"
    )
    if not notify:
        return insert
    return (
        f"WITH inserted AS ({insert})"
        " SELECT scope_hash, job_id, queue, pg_notify(%s, queue) FROM inserted"
    )


def _row_params(
    scope_hash: str, job_id: str, sub: JobSubmission, run_at: Any, not_before: Any, now: Any
) -> tuple[Any, ...]:
    return (
        scope_hash,
        job_id,
        sub.handler,
        sub.handler_version,
        sub.payload_json,
        sub.queue,
        sub.priority,
        sub.max_attempts,
        not_before,
        run_at,
        JobStatus.QUEUED.value,
        False,
        now,
        now,
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
    notify = run_at <= now and is_postgres(connection)
    params: list[Any] = list(
        _row_params(
            scope_hash,
            job_id,
            sub,
            adapt_dt(connection, run_at),
            adapt_dt(connection, sub.initial_not_before),
            adapt_dt(connection, now),
        )
    )
    if notify:
        params.append(jobs_settings().NOTIFY_CHANNEL)
    if not fetch(connection, _insert_sql(1, notify=notify), params):
        return None
    return _new_snapshot(scope_hash, job_id, sub, now)


#: PostgreSQL: a bulk insert as 10 array parameters, whatever the number of rows, so
#: that neither the client nor the server parses thousands of placeholders.
_INSERT_UNNEST_SQL = (
    f"INSERT INTO {JOB} ({_JOB_COLUMNS})"
    " SELECT s, j, h, v, p, q, pr, ma, nb, ra, %s, 0, %s, '', '', '', %s, %s"
    " FROM unnest(%s::varchar[], %s::varchar[], %s::varchar[], %s::int[], %s::text[],"
    " %s::varchar[], %s::smallint[], %s::int[], %s::timestamptz[], %s::timestamptz[])"
    " AS t(s, j, h, v, p, q, pr, ma, nb, ra)"
    " ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING scope_hash, job_id, queue"
)


def _insert_many(
    connection: BaseDatabaseWrapper,
    items: Sequence[tuple[str, str, JobSubmission]],
    now: datetime,
) -> set[tuple[str, str]]:
    """Insert the (distinct) identities of ``items`` that do not exist yet, in the
    current transaction; wake workers once per queue that got due jobs. Returns the
    identities inserted."""
    inserted: set[tuple[str, str]] = set()
    now_db = adapt_dt(connection, now)
    with connection.cursor() as cursor:
        if is_postgres(connection):
            columns: list[list[Any]] = [[] for _ in range(10)]
            for scope_hash, job_id, sub in items:
                row = _row_params(
                    scope_hash,
                    job_id,
                    sub,
                    sub.initial_not_before or now,
                    sub.initial_not_before,
                    now,
                )
                for column, value in zip(columns, row[:10], strict=True):
                    column.append(value)
            cursor.execute(_INSERT_UNNEST_SQL, [JobStatus.QUEUED.value, False, now, now, *columns])
            inserted.update((r[0], r[1]) for r in cursor.fetchall())
        else:
            for start in range(0, len(items), _INSERT_CHUNK):
                chunk = items[start : start + _INSERT_CHUNK]
                params: list[Any] = []
                for scope_hash, job_id, sub in chunk:
                    not_before = adapt_dt(connection, sub.initial_not_before)
                    run_at = now_db if not_before is None else not_before
                    params.extend(_row_params(scope_hash, job_id, sub, run_at, not_before, now_db))
                cursor.execute(_insert_sql(len(chunk), notify=False), params)
                inserted.update((r[0], r[1]) for r in cursor.fetchall())
    due_queues = {
        sub.queue
        for scope_hash, job_id, sub in items
        if (scope_hash, job_id) in inserted
        and (sub.initial_not_before is None or sub.initial_not_before <= now)
    }
    for queue in sorted(due_queues):
        _notify(connection, queue)
    return inserted


def _existing_many(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], JobSnapshot]:
    """The stored jobs among ``keys`` (scope_hash, job_id), read in one query per
    scope and chunk."""
    by_scope: dict[str, list[str]] = {}
    for scope_hash, job_id in keys:
        by_scope.setdefault(scope_hash, []).append(job_id)
    found: dict[tuple[str, str], JobSnapshot] = {}
    for scope_hash, job_ids in by_scope.items():
        for start in range(0, len(job_ids), _INSERT_CHUNK):
            chunk = job_ids[start : start + _INSERT_CHUNK]
            for job in Job.objects.for_scope(scope_hash).filter(job_id__in=chunk):
                found[(job.scope_hash, job.job_id)] = snapshot(job)
    return found


def _same_request(existing: JobSnapshot, job_id: str, sub: JobSubmission) -> SubmitResult:
    differing = existing.submission().differing_fields(sub)
    if differing:
        return SubmitResult(
            job_id=job_id, snapshot=None, conflict=JobIdentityConflict(job_id, differing)
        )
    return SubmitResult(job_id=job_id, snapshot=existing)


def _existing_or_conflict(scope_hash: str, job_id: str, sub: JobSubmission) -> JobSnapshot | None:
    """The stored job if it is the same request; JobIdentityConflict if it differs."""
    job = Job.objects.for_scope(scope_hash).filter(job_id=job_id).first()
    if job is None:
        return None
    return _same_request(snapshot(job), job_id, sub).job()


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
    """J3: create the job in a short transaction of its own (idempotent per identity).

    The insert, with its wake-up, is a single statement run in autocommit: it is its
    own transaction, committed in one round trip. If the identity exists, the winner
    is read by a fresh statement.
    """
    alias = alias_for(Job)
    if _in_caller_atomic_block(transaction.get_connection(alias)):
        raise AmbientTransactionError()
    now = _now(now)
    for _ in range(3):
        created = _insert(scope_hash, job_id, sub, now)
        if created is not None:
            return created
        existing = _existing_or_conflict(scope_hash, job_id, sub)
        if existing is not None:
            return existing
        # The conflicting row vanished between the insert and the read (deleted by
        # retention); insert again.
    raise IntegrityError(f"job {job_id!r}: identity conflict without a visible winner")


def submit_many(
    items: Sequence[tuple[str, str, JobSubmission]], *, now: datetime | None = None
) -> list[SubmitResult]:
    """J3 for many jobs: one short transaction of its own, one outcome per item.

    Each item (scope_hash, job_id, submission) behaves as ``submit`` would, in the
    order given: a new identity is created; an identical request returns the stored
    job (``created`` False) — also when the same identity appears earlier in the
    batch —; a different request gets its :class:`JobIdentityConflict` as the item's
    outcome, not raised. Database errors roll the whole batch back and propagate.
    """
    alias = alias_for(Job)
    connection = transaction.get_connection(alias)
    if _in_caller_atomic_block(connection):
        raise AmbientTransactionError()
    now = _now(now)
    first: dict[tuple[str, str], int] = {}
    for index, (scope_hash, job_id, _sub) in enumerate(items):
        first.setdefault((scope_hash, job_id), index)
    stored: dict[tuple[str, str], JobSnapshot] = {}
    results: dict[int, SubmitResult] = {}
    pending = list(first.values())
    for _ in range(3):
        with transaction.atomic(using=alias):
            inserted = _insert_many(connection, [items[i] for i in pending], now)
            existing = _existing_many(
                (items[i][0], items[i][1]) for i in pending if items[i][:2] not in inserted
            )
        missing = []
        for index in pending:
            scope_hash, job_id, sub = items[index]
            key = (scope_hash, job_id)
            if key in inserted:
                stored[key] = _new_snapshot(scope_hash, job_id, sub, now)
                results[index] = SubmitResult(job_id=job_id, snapshot=stored[key])
            elif key in existing:
                stored[key] = existing[key]
                results[index] = _same_request(existing[key], job_id, sub)
            else:
                # The conflicting row vanished between the insert and the read
                # (deleted by retention); insert again.
                missing.append(index)
        pending = missing
        if not pending:
            break
    else:
        job_ids = ", ".join(repr(items[i][1]) for i in pending[:5])
        raise IntegrityError(f"jobs {job_ids}: identity conflict without a visible winner")
    outcomes = []
    for index, (scope_hash, job_id, sub) in enumerate(items):
        result = results.get(index)
        if result is None:  # a repeated identity: compared with what its first occurrence stored
            earlier = stored[(scope_hash, job_id)]
            result = _same_request(replace(earlier, created=False), job_id, sub)
        outcomes.append(result)
    return outcomes


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
        # Queued again for another reason than J19: a new window if that comes up.
        "handler_unknown_since": None,
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


_CLAIM_RETURNING = (
    "id, scope_hash, job_id, current_token, attempt_count, max_attempts, handler,"
    " handler_version, payload_json, queue, priority, next_run_at, leased_by, started_at"
)
_ATTEMPT_INSERT = (
    f"INSERT INTO {ATTEMPT} (job_id, number, token, status, worker_id, progress,"
    " progress_message, error, result_ref, started_at, finished_at)"
)


@functools.lru_cache(maxsize=64)
def _claim_sql(vendor: str, *, queues: int, one_job: bool, finishing: bool = False) -> str:
    """The claim: one guarded UPDATE of up to LIMIT due jobs, returning them.

    On PostgreSQL the same statement also inserts each claimed job's Running attempt
    row (a data-modifying CTE), so a claim is one round trip; on SQLite the attempt
    rows follow as a second statement of the same transaction. With ``finishing``
    (PostgreSQL only), the statement first completes a batch of attempts — see
    :func:`_finish_ctes` — and every row it returns starts with its kind: ``'f'`` (a
    finished token), ``'m'`` (a token whose attempt row is missing: then the statement
    changes nothing at all) or ``'c'`` (a claimed job). Being one statement, it is
    atomic by itself: the worker runs it in autocommit, one round trip in all.
    """
    filters = [
        # Literals, not parameters, so that even a generic plan of the prepared
        # statement can prove the due index's predicate and use it.
        f"status = '{JobStatus.QUEUED.value}'",
        "NOT cancel_requested",
        "next_run_at <= %s",
        "attempt_count < max_attempts",
    ]
    if queues:
        filters.append(f"queue IN ({placeholders(queues)})")
    if one_job:
        filters.append("scope_hash = %s AND job_id = %s")
    postgres = vendor == "postgresql"
    lock = " FOR UPDATE SKIP LOCKED" if postgres else ""
    # PostgreSQL: the chosen ids as an array, so that the update finds them by primary
    # key whatever the plan's row estimate (an IN sub-select may be planned as a
    # hash join over the whole table).
    chosen, close = ("= ANY(ARRAY", ")") if postgres else ("IN", "")
    guard = "NOT EXISTS (SELECT 1 FROM orphans) AND " if finishing else ""
    update = (
        f"UPDATE {JOB} SET status = '{JobStatus.RUNNING.value}',"
        " attempt_count = attempt_count + 1,"
        f" current_token = {random_token_sql(vendor)},"
        " leased_by = %s, lease_expires_at = %s, started_at = %s, updated_at = %s,"
        " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
        " finished_at = NULL"
        f" WHERE {guard}id {chosen} (SELECT id FROM {JOB} WHERE {' AND '.join(filters)}"
        f" ORDER BY priority DESC, next_run_at, id LIMIT %s{lock}){close}"
        f" RETURNING {_CLAIM_RETURNING}"
    )
    if not postgres:
        return update
    ctes = (
        f"claimed AS ({update}),"
        f" attempts AS ({_ATTEMPT_INSERT} SELECT id, attempt_count, current_token,"
        f" '{AttemptStatus.RUNNING.value}', leased_by, NULL, '', '', NULL, started_at, NULL"
        " FROM claimed)"
    )
    if not finishing:
        return f"WITH {ctes} SELECT {_CLAIM_RETURNING} FROM claimed"
    blanks = ", ".join(["NULL"] * 14)
    return (
        f"WITH {_finish_ctes()}, {ctes}"
        f" SELECT 'f', token, status, token IN (SELECT token FROM finished_attempts), {blanks}"
        " FROM finished"
        f" UNION ALL SELECT 'c', NULL, NULL, NULL, {_CLAIM_RETURNING} FROM claimed"
        # Last: a union takes its column types from the branches before.
        f" UNION ALL SELECT 'm', token, NULL, NULL, {blanks} FROM orphans"
    )


def _finish_ctes() -> str:
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


def _claim_rows(
    connection: BaseDatabaseWrapper,
    worker_id: str,
    *,
    limit: int,
    queue_list: list[str],
    identity: tuple[str, str] | None,
    expires: datetime,
    now: datetime,
    finishing: Sequence[tuple[Claim, str | None]] = (),
) -> tuple[dict[str, FinishOutcome], list[Claim]]:
    """Claim inside the caller's transaction (see :func:`claim`); on PostgreSQL, also
    complete ``finishing`` in the same statement (see :func:`_finish_ctes`)."""
    now_db = adapt_dt(connection, now)
    params: list[Any] = []
    if finishing:
        tokens = [claim.token for claim, _ in finishing]
        results = [result for _, result in finishing]
        params.extend([tokens, results, tokens, now_db, now_db, tokens, now_db])
    params.extend([worker_id, adapt_dt(connection, expires), now_db, now_db, now_db, *queue_list])
    if identity is not None:
        params.extend(identity)
    params.append(limit)
    sql = _claim_sql(
        connection.vendor,
        queues=len(queue_list),
        one_job=identity is not None,
        finishing=bool(finishing),
    )
    outcomes: dict[str, FinishOutcome] = {}
    rows = fetch(connection, sql, params)
    if finishing:
        outcomes = _finished_outcomes(finishing, rows)
        rows = [r[4:] for r in rows if r[0] == "c"]
    if rows and not is_postgres(connection):
        with connection.cursor() as cursor:
            cursor.execute(
                f"{_ATTEMPT_INSERT} VALUES "
                + ", ".join(["(%s, %s, %s, %s, %s, NULL, '', '', NULL, %s, NULL)"] * len(rows)),
                [
                    value
                    for r in rows
                    for value in (r[0], r[4], r[3], AttemptStatus.RUNNING.value, worker_id, now_db)
                ],
            )
    if len(rows) > 1:
        rows.sort(key=lambda r: (-r[10], read_dt(r[11]), r[0]))
    claims = [
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
    return outcomes, claims


def _finished_outcomes(
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
    validation.integer(limit, "limit", 1, 10_000)
    return complete_and_claim(
        (),
        worker_id,
        limit=limit,
        queues=queues,
        lease_seconds=lease_seconds,
        identity=identity,
        now=now,
    )[1]


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


def _complete_rows(
    connection: BaseDatabaseWrapper,
    completions: Sequence[tuple[Claim, str | None]],
    now: datetime,
) -> dict[str, FinishOutcome]:
    """SQLite: ``complete`` for many attempts inside the caller's transaction — two
    statements for the whole batch, each row guarded by its own token (see
    :func:`complete_many`; PostgreSQL uses :func:`_finish_ctes`)."""
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


def complete_many(
    completions: Sequence[tuple[Claim, str | None]], *, now: datetime | None = None
) -> dict[str, FinishOutcome]:
    """J8 ``complete`` for several attempts in one transaction: ``(claim, result_ref)``
    pairs in, each token's outcome out.

    Every attempt is finished exactly as :func:`finish` would finish it alone — only
    if its token is current and its job Running; Cancelled, result dropped, if a cancel
    request committed first; its attempt row in the same transaction — but the batch
    shares one commit. A stale token is ``STALE`` and changes nothing; a missing
    attempt row fails the whole batch (``AttemptRowMissing``), which changes nothing.
    """
    return complete_and_claim(completions, "", limit=0, now=now)[0]


def complete_and_claim(
    completions: Sequence[tuple[Claim, str | None]],
    worker_id: str,
    *,
    limit: int,
    queues: Sequence[str] | None = None,
    lease_seconds: float | None = None,
    identity: tuple[str, str] | None = None,
    now: datetime | None = None,
) -> tuple[dict[str, FinishOutcome], list[Claim]]:
    """A worker's round trip: finish ``completions`` as :func:`complete_many` does, then
    claim up to ``limit`` due jobs as :func:`claim` does — one transaction, one commit.

    The two parts keep their own guards and outcomes; sharing the commit only means
    that either both take effect or neither does. On PostgreSQL they are one
    statement, run in autocommit when the caller has no transaction open.
    """
    checked = [(claim, _result_ref(result)) for claim, result in completions]
    validation.integer(limit, "limit", 0, 10_000)
    if limit:
        worker_id = validation.text(worker_id, "worker_id", validation.MAX_NAME_LENGTH)
    if not checked and not limit:
        return {}, []
    now = _now(now)
    expires = now + timedelta(seconds=lease_seconds or jobs_settings().LEASE_SECONDS)
    alias = alias_for(Job)
    connection = connection_for(Job)
    claim_rows = functools.partial(
        _claim_rows,
        connection,
        worker_id,
        limit=limit,
        queue_list=list(queues or []),
        identity=identity,
        expires=expires,
        now=now,
    )
    if is_postgres(connection):
        # One statement finishes and claims (LIMIT 0 claims nothing); it is atomic by
        # itself, so in autocommit it is its own transaction: one round trip.
        if connection.get_autocommit():
            return claim_rows(finishing=checked)
        with transaction.atomic(using=alias):
            return claim_rows(finishing=checked)
    # SQLite has no data-modifying CTEs: the completion statements come first.
    with transaction.atomic(using=alias):
        outcomes = _complete_rows(connection, checked, now) if checked else {}
        if not limit:
            return outcomes, []
        finished, claims = claim_rows()
    return outcomes | finished, claims


def _result_ref(value: str | None) -> str | None:
    if value is None:
        return None
    return validation.text(value, "result_ref", validation.MAX_TEXT_LENGTH)


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


def put_back_unknown_handler(
    token: str, reason: str, *, now: datetime | None = None
) -> FinishOutcome:
    """J19: the worker holding ``token`` does not know the job's handler or version.

    One guarded statement (token current, job Running) undoes the claim — the
    attempt count goes back down and the attempt row is deleted, so the claim never
    counts as an attempt — and, decided in the database: a cancel request that
    committed first ends the job Cancelled; else, while fewer than
    ``UNKNOWN_HANDLER_RETRY_SECONDS`` have passed since the job's first such claim
    (``handler_unknown_since``, set by the first), the job is Queued again
    ``UNKNOWN_HANDLER_RETRY_DELAY`` seconds later (``PUT_BACK``); after that it
    ends Failed with ``reason`` (which names the handler and version). A stale token
    changes nothing (``STALE``); a missing attempt row fails the whole transition.
    """
    token = _check_token(token)
    reason = validation.text(reason, "reason", validation.MAX_TEXT_LENGTH - 200)
    now = _now(now)
    s = jobs_settings()
    window = s.UNKNOWN_HANDLER_RETRY_SECONDS
    run_at = now + timedelta(seconds=min(s.UNKNOWN_HANDLER_RETRY_DELAY, window))
    waiting = (
        f"{reason} (put back until a worker that knows it claims it, for at most "
        f"{window:g} s since its first claim: JOBS['UNKNOWN_HANDLER_RETRY_SECONDS'])"
    )
    failed = (
        f"{reason} (no worker knew it within {window:g} s of its first claim: "
        "JOBS['UNKNOWN_HANDLER_RETRY_SECONDS'])"
    )
    connection = connection_for(Job)
    now_db = adapt_dt(connection, now)
    since = "COALESCE(handler_unknown_since, %s)"
    over = f"{since} <= %s"
    over_params = [now_db, adapt_dt(connection, now - timedelta(seconds=window))]
    with transaction.atomic(using=alias_for(Job)):
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {JOB} SET"
                " status = CASE WHEN cancel_requested THEN %s"
                f" WHEN {over} THEN %s ELSE %s END,"
                f" finished_at = CASE WHEN cancel_requested OR {over} THEN %s ELSE NULL END,"
                f" next_run_at = CASE WHEN cancel_requested OR {over} THEN next_run_at"
                " ELSE %s END,"
                " error = CASE WHEN cancel_requested THEN ''"
                f" WHEN {over} THEN %s ELSE %s END,"
                f" handler_unknown_since = {since},"
                " attempt_count = attempt_count - 1, updated_at = %s,"
                " current_token = NULL, leased_by = '', lease_expires_at = NULL,"
                " started_at = NULL, progress = NULL, progress_message = '', result_ref = NULL"
                " WHERE current_token = %s AND status = %s"
                " RETURNING status",
                [
                    JobStatus.CANCELLED.value,
                    *over_params,
                    JobStatus.FAILED.value,
                    JobStatus.QUEUED.value,
                    *over_params,
                    now_db,
                    *over_params,
                    adapt_dt(connection, run_at),
                    *over_params,
                    failed,
                    waiting,
                    now_db,
                    now_db,
                    token,
                    JobStatus.RUNNING.value,
                ],
            )
            row = cursor.fetchone()
        if row is None:
            return FinishOutcome.STALE
        deleted, _ = JobAttempt.objects.filter(token=token, status=AttemptStatus.RUNNING).delete()
        if not deleted:
            raise AttemptRowMissing()
    final = JobStatus(row[0])
    return FinishOutcome.PUT_BACK if final is JobStatus.QUEUED else FinishOutcome(final.value)


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


# --------------------------------------------------------------------------- retention


_FINISHED_SQL = ", ".join(f"'{status.value}'" for status in FINISHED_STATUSES)


def _oldest_finished_sql(vendor: str) -> str:
    """The ids of the oldest finished jobs before a time (parameters: time, limit)."""
    lock = " FOR UPDATE SKIP LOCKED" if vendor == "postgresql" else ""
    return (
        f"SELECT id FROM {JOB} WHERE status IN ({_FINISHED_SQL}) AND finished_at < %s"
        f" ORDER BY finished_at LIMIT %s{lock}"
    )


def purge_finished(*, older_than: datetime, limit: int = 1000) -> int:
    """Retention: delete up to ``limit`` finished jobs (Succeeded, Failed, Cancelled,
    Interrupted) that finished before ``older_than``, oldest first, with their attempts.

    One statement per batch — a job and its attempt history go together or not at
    all — and it reads only the index of finished jobs. A Queued or Running job is
    never touched, and neither is a job whose row another transaction holds (a retry
    under way, on PostgreSQL: ``SKIP LOCKED``); the status is checked again by the
    delete itself. Returns the number of jobs deleted.
    """
    older_than = validation.aware_utc(older_than, "older_than")
    validation.integer(limit, "limit", 1, 100_000)
    alias = alias_for(Job)
    connection = connection_for(Job)
    postgres = is_postgres(connection)
    oldest = _oldest_finished_sql(connection.vendor)
    params = [adapt_dt(connection, older_than), limit]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if postgres:
            # Ids as arrays: primary-key and (job, number) lookups whatever the plan's
            # estimates. The attempts' foreign key is checked at commit.
            cursor.execute(
                f"WITH gone AS (DELETE FROM {JOB} WHERE id = ANY(ARRAY({oldest}))"
                f" AND status IN ({_FINISHED_SQL}) RETURNING id),"
                f" attempts AS (DELETE FROM {ATTEMPT}"
                " WHERE job_id = ANY(ARRAY(SELECT id FROM gone)))"
                " SELECT count(*) FROM gone",
                params,
            )
            return int(cursor.fetchone()[0])
        cursor.execute(
            f"DELETE FROM {JOB} WHERE id IN ({oldest}) AND status IN ({_FINISHED_SQL})"
            " RETURNING id",
            params,
        )
        ids = [row[0] for row in cursor.fetchall()]
        for start in range(0, len(ids), _INSERT_CHUNK):
            chunk = ids[start : start + _INSERT_CHUNK]
            cursor.execute(
                f"DELETE FROM {ATTEMPT} WHERE job_id IN ({placeholders(len(chunk))})", chunk
            )
    return len(ids)
