"""Uniqueness and debounce at submit: a job with a ``unique_key`` is inserted only
while no job of its scope holds the key — two partial unique indexes of ``jobs_job``
for the "queued" and "active" modes, a row of ``jobs_uniquehold`` for ``unique_for`` —
and a debounced submission first replaces the payload and start of the Queued job that
holds its key. Every decision is the database's: a racing second insert waits for the
first and yields (``ON CONFLICT DO NOTHING``), a debounce is a guarded ``UPDATE`` of a
Queued job, a hold is an upsert that takes only an ended hold."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import adapt_dt, connection_for

from ..db import fetch
from ..exceptions import JobIdentityUnresolved
from ..fair_share import place
from ..models import Job, UniqueHold
from ..submit_rules import UNIQUE_FOR
from ..types import JobSnapshot, JobStatus, JobSubmission
from . import sql_submit
from .reads import snapshot

#: Inserts a job's row (``unique=True``: with its key, yielding to any constraint);
#: the new job, or None if nothing was inserted.
InsertRow = Callable[[str, str, JobSubmission, datetime], JobSnapshot | None]

#: The states in which a job holds its key, by mode.
_HOLDING = {
    "queued": (JobStatus.QUEUED,),
    "active": (JobStatus.QUEUED, JobStatus.RUNNING),
}


def _stored(scope_hash: str, job_id: str) -> JobSnapshot | None:
    job = Job.objects.for_scope(scope_hash).filter(job_id=job_id).first()
    return None if job is None else snapshot(job)


def _holder(scope_hash: str, sub: JobSubmission, now: datetime) -> JobSnapshot | None:
    """The job of the scope that holds ``sub``'s key now, in ``sub``'s mode."""
    rules = sub.rules
    if rules.unique_mode == UNIQUE_FOR:
        hold = UniqueHold.objects.filter(
            scope_hash=scope_hash, unique_key=rules.unique_key, until__gt=now
        ).first()
        return None if hold is None else _stored(scope_hash, hold.job_id)
    job = (
        Job.objects.for_scope(scope_hash)
        .filter(unique_key=rules.unique_key, status__in=_HOLDING[rules.unique_mode])
        .order_by("id")
        .first()
    )
    return None if job is None else snapshot(job)


def _debounce(
    connection: BaseDatabaseWrapper, scope_hash: str, sub: JobSubmission, now: datetime
) -> JobSnapshot | None:
    """Replace the payload and start of the Queued job that holds ``sub``'s key; the
    job, or None if no Queued job holds it (none yet, or claimed)."""
    assert sub.rules.debounce is not None
    run_at = now + timedelta(seconds=sub.rules.debounce)
    params = {
        "payload_json": sub.payload_json,
        "run_at": adapt_dt(connection, run_at),
        "run_place": place(run_at),
        "now": adapt_dt(connection, now),
        "scope_hash": scope_hash,
        "unique_key": sub.rules.unique_key,
    }
    rows = fetch(connection, sql_submit.debounce_job(connection.vendor), params)
    return _stored(scope_hash, rows[0]["job_id"]) if rows else None


def _take_hold(
    connection: BaseDatabaseWrapper, scope_hash: str, job_id: str, sub: JobSubmission, now: datetime
) -> bool:
    """Take ``sub``'s key for ``unique_for`` seconds for job ``job_id``: True if no
    other job holds it now."""
    assert sub.rules.unique_for is not None
    params = {
        "scope_hash": scope_hash,
        "unique_key": sub.rules.unique_key,
        "job_id": job_id,
        "until": adapt_dt(connection, now + timedelta(seconds=sub.rules.unique_for)),
        "now": adapt_dt(connection, now),
    }
    return bool(fetch(connection, sql_submit.TAKE_HOLD, params))


def insert_unique(
    scope_hash: str, job_id: str, sub: JobSubmission, now: datetime, insert_row: InsertRow
) -> JobSnapshot | None:
    """Submit ``sub``, which carries a unique key, as job ``job_id``: the new job; the
    job that holds the key (``created`` False) — replaced first when ``sub``
    debounces —; or None if job ``job_id`` exists already (the caller compares the
    requests). In the current transaction, or one of its own if there is none."""
    connection = connection_for(Job)
    rules = sub.rules
    for _ in range(3):
        # A hold and its job's insert commit together. A debounce needs no transaction
        # of its own: should another submission insert the key's job between the
        # update that found none and this insert, the insert yields and the next turn
        # replaces that job.
        scope: AbstractContextManager[Any] = (
            transaction.atomic(using=connection.alias, savepoint=False)
            if rules.unique_for is not None
            else nullcontext()
        )
        with scope:
            if rules.debounce is not None:
                replaced = _debounce(connection, scope_hash, sub, now)
                if replaced is not None:
                    return replaced
            if rules.unique_for is not None and not _take_hold(
                connection, scope_hash, job_id, sub, now
            ):
                created = None
            else:
                created = insert_row(scope_hash, job_id, sub, now)
        if created is not None:
            return created
        if Job.objects.for_scope(scope_hash).filter(job_id=job_id).exists():
            return None
        holder = _holder(scope_hash, sub, now)
        if holder is not None:
            return holder
        # The holder left its state between the insert and the read: submit again.
    raise JobIdentityUnresolved([job_id])
