"""Batches: jobs submitted together, counted together, with one ``then`` job submitted
in the transaction that ends the last of them (see :mod:`jobs.store.endings`).

``submit_batch`` runs in a transaction of its own, ``stage_batch`` in the caller's: the
batch's row and every one of its jobs, or nothing. The same batch id with the same
jobs (and ``then``) returns the stored batch (``created`` False); other jobs raise
``BatchIdentityConflict``, as does a job id of the batch taken by a job outside it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import adapt_dt, alias_for, connection_for, in_caller_atomic_block, is_postgres

from ..db import fetch
from ..exceptions import (
    AmbientTransactionError,
    BatchIdentityConflict,
    JobIdentityUnresolved,
    TransactionRequiredError,
)
from ..models import Batch, Job
from ..signals import jobs_enqueued
from ..types import IDENTITY_FIELDS, BatchSnapshot, JobSubmission
from . import sql_endings
from .base import current_time
from .endings import admit
from .submission import _insert_many, _insert_new, _new_snapshot, _trace_context

#: The suffix of a batch's ``then`` job id: ``"<batch id>:then"``.
THEN_SUFFIX = ":then"


def then_job_id(batch_id: str) -> str:
    """The job id of batch ``batch_id``'s ``then`` job."""
    return batch_id + THEN_SUFFIX


def _identity(sub: JobSubmission) -> list[Any]:
    values: list[Any] = [getattr(sub, name) for name in IDENTITY_FIELDS]
    values[IDENTITY_FIELDS.index("initial_not_before")] = (
        None if sub.initial_not_before is None else sub.initial_not_before.isoformat()
    )
    return [*values, sub.rules.sequence_key]


def digest(
    jobs: Sequence[tuple[str, JobSubmission]],
    then: JobSubmission | None,
    then_as: tuple[str, str] | None = None,
) -> str:
    """What makes two batches of one id the same: their jobs (by job id, whatever their
    order) and their ``then`` (with the scope and id it goes to, when named)."""
    then_identity = None if then is None else _identity(then)
    if then_identity is not None and then_as is not None:
        then_identity.append(list(then_as))
    text = json.dumps(
        [
            then_identity,
            sorted([job_id, *_identity(sub)] for job_id, sub in jobs),
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def batch_snapshot(batch: Batch, *, created: bool = False) -> BatchSnapshot:
    """The snapshot of a batch's row."""
    return BatchSnapshot(
        scope_hash=batch.scope_hash,
        batch_id=batch.batch_id,
        total=batch.total,
        succeeded=batch.succeeded,
        failed=batch.failed,
        cancelled=batch.cancelled,
        expired=batch.expired,
        pending=batch.pending,
        then_job_id=_then_of(batch.then_handler, batch.then_scope_hash, batch.batch_id),
        created_at=batch.created_at,
        finished_at=batch.finished_at,
        created=created,
    )


def _then_of(handler: str | None, then_scope_hash: str | None, batch_id: str) -> str | None:
    """The id of a batch's ``then`` job as its scope sees it: None without one, or for
    one staged into another scope (no job of the batch's scope)."""
    return None if handler is None or then_scope_hash is not None else then_job_id(batch_id)


def get_batch(scope_hash: str, batch_id: str) -> BatchSnapshot | None:
    """Batch ``batch_id`` of the scope as stored, or None."""
    batch = Batch.objects.filter(scope_hash=scope_hash, batch_id=batch_id).first()
    return None if batch is None else batch_snapshot(batch)


def _create(
    scope_hash: str,
    batch_id: str,
    jobs: Sequence[tuple[str, JobSubmission]],
    then: JobSubmission | None,
    now: datetime,
    then_as: tuple[str, str] | None = None,
    total: int | None = None,
) -> BatchSnapshot:
    """The batch in the current transaction: its row, then its jobs; or the stored
    batch if it is the same. Raises ``BatchIdentityConflict`` — the caller's
    transaction must then roll back — for another batch of the id, or a job id taken.
    ``then_as``: the scope hash and job id of the ``then`` job (None: its own).
    ``total``: its jobs, those to come included (None: ``jobs`` alone)."""
    connection = connection_for(Job)
    fingerprint = digest(jobs, then, then_as)
    total = len(jobs) if total is None else total
    params = {
        "scope_hash": scope_hash,
        "batch_id": batch_id,
        "digest": fingerprint,
        "total": total,
        "then_scope_hash": None if then is None or then_as is None else then_as[0],
        "then_job_id": None if then is None or then_as is None else then_as[1],
        "then_handler": None if then is None else then.handler,
        "then_version": None if then is None else then.handler_version,
        "then_payload_json": None if then is None else then.payload_json,
        "then_queue": None if then is None else then.queue,
        "then_priority": None if then is None else then.priority,
        "then_max_attempts": None if then is None else then.max_attempts,
        "then_cost": None if then is None else then.cost,
        "then_not_before": None
        if then is None or then.initial_not_before is None
        else adapt_dt(connection, then.initial_not_before),
        "trace_context": _trace_context(),
        "now": adapt_dt(connection, now),
    }
    if not fetch(connection, sql_endings.INSERT_BATCH, params):
        stored = Batch.objects.filter(scope_hash=scope_hash, batch_id=batch_id).first()
        if stored is None:  # deleted between the insert and the read
            raise JobIdentityUnresolved([batch_id])
        if stored.digest != fingerprint:
            raise BatchIdentityConflict(batch_id, "it exists with other jobs or another then")
        return batch_snapshot(stored)
    _insert_jobs(connection, scope_hash, batch_id, jobs, now)
    return BatchSnapshot(
        scope_hash=scope_hash,
        batch_id=batch_id,
        total=total,
        succeeded=0,
        failed=0,
        cancelled=0,
        expired=0,
        pending=total,
        then_job_id=_then_of(
            None if then is None else then.handler,
            None if then_as is None else then_as[0],
            batch_id,
        ),
        created_at=now,
        finished_at=None,
        created=True,
    )


def _insert_jobs(
    connection: BaseDatabaseWrapper,
    scope_hash: str,
    batch_id: str,
    jobs: Sequence[tuple[str, JobSubmission]],
    now: datetime,
) -> None:
    """The jobs of batch ``batch_id`` of the scope, all new, in the current
    transaction (:func:`_insert_members`); their ``jobs_enqueued`` on its commit."""
    items = [(scope_hash, job_id, sub) for job_id, sub in jobs]
    _insert_members(connection, batch_id, items, now)
    if jobs_enqueued.receivers:
        snapshots = [replace(_new_snapshot(*item, now), batch_id=batch_id) for item in items]
        transaction.on_commit(
            lambda: jobs_enqueued.send(
                sender=Job, snapshots=snapshots, staged=False, using=alias_for(Job)
            ),
            using=alias_for(Job),
        )


def _insert_members(
    connection: BaseDatabaseWrapper,
    batch_id: str,
    items: Sequence[tuple[str, str, JobSubmission]],
    now: datetime,
) -> None:
    """The batch's jobs, all new, in the current transaction: on PostgreSQL one
    statement that takes their places in line too (a plain insert: the batch's row,
    just inserted, orders identical batches, so its jobs meet no insert of their own);
    those of sequences admitted to them. ``BatchIdentityConflict`` if a job id of the
    batch is taken outside it."""
    taken: list[str] = []
    if is_postgres(connection):
        skipped = _insert_new(connection, items, now, batch_id=batch_id)
        if skipped is None:
            raise BatchIdentityConflict(batch_id, "a job id of it was taken meanwhile")
        if skipped:
            taken = [items[n][1] for n in skipped]
        else:
            admit(
                connection,
                [
                    (scope_hash, job_id, sub.rules.sequence_key)
                    for scope_hash, job_id, sub in items
                    if sub.rules.sequence_key is not None
                ],
                now,
            )
    else:
        inserted = _insert_many(connection, items, now, batch_id=batch_id)
        taken = [
            job_id for scope_hash, job_id, _sub in items if (scope_hash, job_id) not in inserted
        ]
    if taken:
        named = ", ".join(repr(job_id) for job_id in taken[:5])
        raise BatchIdentityConflict(batch_id, f"job ids taken outside it: {named}")


def submit_batch(
    scope_hash: str,
    batch_id: str,
    jobs: Sequence[tuple[str, JobSubmission]],
    then: JobSubmission | None,
    *,
    now: datetime | None = None,
) -> BatchSnapshot:
    """Create the batch and its jobs in a transaction of their own (see the module)."""
    alias = alias_for(Job)
    if in_caller_atomic_block(transaction.get_connection(alias)):
        raise AmbientTransactionError()
    now = current_time(now)
    with transaction.atomic(using=alias):
        return _create(scope_hash, batch_id, jobs, then, now)


def stage_batch(
    scope_hash: str,
    batch_id: str,
    jobs: Sequence[tuple[str, JobSubmission]],
    then: JobSubmission | None,
    *,
    now: datetime | None = None,
    then_as: tuple[str, str] | None = None,
    total: int | None = None,
) -> BatchSnapshot:
    """Create the batch and its jobs inside the caller's open transaction; on a conflict
    or any database error the transaction is marked for rollback first.

    Trusted code only (no scope's API passes them): ``then_as``, the scope hash and
    job id the ``then`` job is inserted as, instead of ``"<batch id>:then"`` of the
    batch's scope (a job of that id already there is kept, as a second ``then`` of a
    batch opened again by a retry is); ``total``, the batch's jobs with those its
    stager adds later (:func:`extend_batch`), counted pending from now, so that its
    ``then`` waits for them too."""
    alias = alias_for(Job)
    if not in_caller_atomic_block(transaction.get_connection(alias)):
        raise TransactionRequiredError()
    now = current_time(now)
    try:
        return _create(scope_hash, batch_id, jobs, then, now, then_as, total)
    except (BatchIdentityConflict, JobIdentityUnresolved, DatabaseError):
        transaction.set_rollback(True, using=alias)
        raise


def extend_batch(
    scope_hash: str,
    batch_id: str,
    jobs: Sequence[tuple[str, JobSubmission]],
    *,
    now: datetime | None = None,
) -> None:
    """Insert more jobs of batch ``batch_id`` of the scope, staged with a ``total``
    that counts them (:func:`stage_batch`), inside the caller's open transaction:
    their batch's counts already hold them. Trusted code only, which keeps within the
    total it staged. ``JobIdentityUnresolved`` if the batch is not there; on that,
    a job id taken or any database error the transaction is marked for rollback."""
    alias = alias_for(Job)
    if not in_caller_atomic_block(transaction.get_connection(alias)):
        raise TransactionRequiredError()
    now = current_time(now)
    try:
        if not Batch.objects.filter(scope_hash=scope_hash, batch_id=batch_id).exists():
            raise JobIdentityUnresolved([batch_id])
        _insert_jobs(connection_for(Job), scope_hash, batch_id, jobs, now)
    except (BatchIdentityConflict, JobIdentityUnresolved, DatabaseError):
        transaction.set_rollback(True, using=alias)
        raise
