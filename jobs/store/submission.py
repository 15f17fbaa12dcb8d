"""Creation of jobs: ``submit`` and ``submit_many`` in a transaction of their own (J3),
``stage`` in the caller's (J4); idempotent per (scope, job id) (J2)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import adapt_dt, alias_for, connection_for, in_caller_atomic_block, is_postgres

from ..conf import jobs_settings
from ..db import fetch, numbered
from ..exceptions import (
    AmbientTransactionError,
    JobIdentityConflict,
    JobIdentityUnresolved,
    TransactionRequiredError,
)
from ..models import Job
from ..types import (
    JobSnapshot,
    JobStatus,
    JobSubmission,
    SubmitResult,
)
from . import sql
from .base import CHUNK_ROWS, current_time, notify
from .reads import job_snapshot, snapshot


def _new_row(scope_hash: str, job_id: str, sub: JobSubmission, now: datetime) -> dict[str, Any]:
    """The values a new job's insert sets, by column (:data:`sql.NEW_JOB_COLUMNS`)."""
    return {
        "scope_hash": scope_hash,
        "job_id": job_id,
        "handler": sub.handler,
        "handler_version": sub.handler_version,
        "payload_json": sub.payload_json,
        "queue": sub.queue,
        "priority": sub.priority,
        "max_attempts": sub.max_attempts,
        "initial_not_before": sub.initial_not_before,
        "next_run_at": sub.initial_not_before or now,
        "status": JobStatus.QUEUED.value,
        "attempt_count": 0,
        "cancel_requested": False,
        "progress_message": "",
        "error": "",
        "leased_by": "",
        "created_at": now,
        "updated_at": now,
    }


#: The columns a new job leaves NULL.
_NULL_AT_CREATION = {"progress": None, "result_ref": None, "started_at": None, "finished_at": None}


def _new_snapshot(row: dict[str, Any]) -> JobSnapshot:
    """The snapshot of the job :func:`_new_row` made, as inserted."""
    return job_snapshot({**row, **_NULL_AT_CREATION}, created=True)


def _adapted(connection: BaseDatabaseWrapper, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its datetimes as the backend stores them."""
    return {
        name: adapt_dt(connection, value) if isinstance(value, datetime) else value
        for name, value in row.items()
    }


def _insert(scope_hash: str, job_id: str, sub: JobSubmission, now: datetime) -> JobSnapshot | None:
    """Insert a new Queued job in the current transaction; None if the identity exists.

    ``ON CONFLICT DO NOTHING`` waits for a concurrent inserter of the same identity
    and then yields to it, so a race never aborts the surrounding transaction.
    """
    connection = connection_for(Job)
    row = _new_row(scope_hash, job_id, sub, now)
    wake = row["next_run_at"] <= now and is_postgres(connection)
    params = numbered([_adapted(connection, row)])
    if wake:
        params["channel"] = jobs_settings().NOTIFY_CHANNEL
    if not fetch(connection, sql.insert_jobs(1, notify=wake), params, prepare=True):
        return None
    return _new_snapshot(row)


def _insert_many(
    connection: BaseDatabaseWrapper,
    items: Sequence[tuple[str, str, JobSubmission]],
    now: datetime,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Insert the (distinct) identities of ``items`` that do not exist yet, in the
    current transaction; wake workers once per queue that got due jobs. Returns the
    rows inserted (see :func:`_new_row`), by identity."""
    rows = [_new_row(scope_hash, job_id, sub, now) for scope_hash, job_id, sub in items]
    if not rows:
        return {}
    inserted_rows: list[dict[str, Any]] = []
    if is_postgres(connection):
        params = {name: [row[name] for row in rows] for name in sql.NEW_JOB_ARRAYS}
        params.update((name, rows[0][name]) for name in sql.NEW_JOB_SHARED)
        inserted_rows = fetch(connection, sql.INSERT_JOBS_UNNEST, params)
    else:
        for start in range(0, len(rows), CHUNK_ROWS):
            chunk = [_adapted(connection, row) for row in rows[start : start + CHUNK_ROWS]]
            inserted_rows += fetch(connection, sql.insert_jobs(len(chunk)), numbered(chunk))
    keys = {(row["scope_hash"], row["job_id"]) for row in inserted_rows}
    inserted = {key: row for row in rows if (key := (row["scope_hash"], row["job_id"])) in keys}
    due_queues = {
        sub.queue
        for scope_hash, job_id, sub in items
        if (scope_hash, job_id) in inserted
        and (sub.initial_not_before is None or sub.initial_not_before <= now)
    }
    for queue in sorted(due_queues):
        notify(connection, queue)
    return inserted


def _existing_many(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], JobSnapshot]:
    """The stored jobs among ``keys`` (scope_hash, job_id), read in one query per
    scope and chunk."""
    by_scope: dict[str, list[str]] = {}
    for scope_hash, job_id in keys:
        by_scope.setdefault(scope_hash, []).append(job_id)
    found: dict[tuple[str, str], JobSnapshot] = {}
    for scope_hash, job_ids in by_scope.items():
        for start in range(0, len(job_ids), CHUNK_ROWS):
            chunk = job_ids[start : start + CHUNK_ROWS]
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


def submit(
    scope_hash: str, job_id: str, sub: JobSubmission, *, now: datetime | None = None
) -> JobSnapshot:
    """J3: create the job in a short transaction of its own (idempotent per identity).

    The insert, with its wake-up, is a single statement run in autocommit: it is its
    own transaction, committed in one round trip. If the identity exists, the winner
    is read by a fresh statement.
    """
    alias = alias_for(Job)
    if in_caller_atomic_block(transaction.get_connection(alias)):
        raise AmbientTransactionError()
    now = current_time(now)
    for _ in range(3):
        created = _insert(scope_hash, job_id, sub, now)
        if created is not None:
            return created
        existing = _existing_or_conflict(scope_hash, job_id, sub)
        if existing is not None:
            return existing
        # The conflicting row vanished between the insert and the read (deleted by
        # retention); insert again.
    raise JobIdentityUnresolved([job_id])


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
    if in_caller_atomic_block(connection):
        raise AmbientTransactionError()
    now = current_time(now)
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
                stored[key] = _new_snapshot(inserted[key])
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
        raise JobIdentityUnresolved([items[i][1] for i in pending])
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
    if not in_caller_atomic_block(connection):
        raise TransactionRequiredError()
    now = current_time(now)
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
        raise JobIdentityUnresolved([job_id])
    return existing
