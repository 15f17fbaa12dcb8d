"""The transitions a scope's caller and an operator ask for: cancel and retry, of one
job (:func:`cancel`, :func:`retry`) or of a batch of jobs by id (:func:`cancel_many`,
:func:`retry_many`, for the bulk operations of :mod:`jobs.bulk`), by the same rules:
each rule is one guard, written once below and used by both."""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Count, F, Q, QuerySet

from ledon.bulk import BatchOutcome, lock_batch
from ledon.db import adapt_dt, alias_for, connection_for

from .. import validation
from ..db import fetch
from ..exceptions import (
    InvalidSubmission,
    InvalidTransition,
    JobNotFound,
)
from ..models import Job
from ..signals import cancelled_queued_job
from ..types import (
    FINISHED_STATUSES,
    RETRYABLE_STATUSES,
    CancelOutcome,
    JobSnapshot,
    JobStatus,
)
from . import sql_endings
from .base import CHUNK_ROWS, current_time, notify, notify_cancel, requeue_fields
from .endings import Moved, readmit, run_moving
from .reads import snapshot
from .sql import QUEUED

# --------------------------------------------------------------------------- the rules

#: A cancel ends a Queued job at once: no attempt runs it.
CANCEL_AT_ONCE = Q(status=JobStatus.QUEUED)
#: A cancel asks a Running job to stop: its handler sees the flag, and its finish ends
#: it Cancelled. (A bulk cancel leaves a job already asked as it is.)
CANCEL_BY_REQUEST = Q(status=JobStatus.RUNNING, cancel_requested=False)


def retry_guard(extra: int) -> Q:
    """The jobs a retry granting ``extra`` attempts re-queues: Failed, Cancelled or
    Interrupted, with an attempt left once ``extra`` more are granted, and
    ``max_attempts`` staying within its limit."""
    return Q(
        status__in=RETRYABLE_STATUSES,
        attempt_count__lt=F("max_attempts") + extra,
        max_attempts__lte=validation.MAX_ATTEMPTS_LIMIT - extra,
    )


def _retry_fields(extra: int, run_at: datetime, now: datetime) -> dict[str, Any]:
    """What a retry writes: queued again for ``run_at``, with ``extra`` attempts more."""
    fields = requeue_fields(run_at, now)
    if extra:
        fields["max_attempts"] = F("max_attempts") + extra
        fields["granted_attempts"] = F("granted_attempts") + extra
    return fields


def _extra_attempts(value: object) -> int:
    return validation.integer(value, "extra_attempts", 0, validation.MAX_ATTEMPTS_LIMIT)


def _requeue(chosen: QuerySet[Job], fields: dict[str, Any], alias: str) -> tuple[int, int]:
    """Queue ``chosen`` (guarded already) again with ``fields``: one ``UPDATE``. A job
    with a unique key may not be Queued while another job of its scope holds that key
    (the unique indexes of ``jobs_job``): if the statement meets one, it is rolled back
    to its savepoint and the jobs go one by one, those whose key is held left as they
    are. The jobs queued again, and those left for their key."""
    try:
        with transaction.atomic(using=alias):
            return chosen.update(**fields), 0
    except IntegrityError:
        pass
    requeued = held_key = 0
    for pk in chosen.order_by("pk").values_list("pk", flat=True):
        try:
            with transaction.atomic(using=alias):
                requeued += chosen.filter(pk=pk).update(**fields)
        except IntegrityError:
            held_key += 1
    return requeued, held_key


def _members(rows: QuerySet[Job]) -> list[Moved]:
    """The jobs of ``rows`` that are in a batch or a sequence, as they are now, each
    as a move to Queued (a retry's): what a retry must follow up."""
    member = Q(batch_id__isnull=False) | Q(sequence_key__isnull=False)
    fields = ("pk", "scope_hash", "job_id", "handler", "queue", "status", "batch_id")
    return [
        Moved(
            id=pk,
            scope_hash=scope_hash,
            job_id=job_id,
            handler=handler,
            queue=queue,
            was=was,
            status=QUEUED,
            batch_id=batch_id,
            sequence_key=sequence_key,
        )
        for pk, scope_hash, job_id, handler, queue, was, batch_id, sequence_key in rows.filter(
            member
        )
        .order_by("pk")
        .values_list(*fields, "sequence_key")
    ]


def _readmit_requeued(
    connection: BaseDatabaseWrapper, members: Sequence[Moved], now: datetime
) -> None:
    """Of ``members`` (read by :func:`_members` before a retry, their rows held), those
    the retry queued again are counted in their batches again and held behind, or
    released into, their sequences — in submission order."""
    retried = [job for job in members if job.was in RETRYABLE_STATUSES]
    if not retried:
        return
    requeued = set(
        Job.objects.filter(pk__in=[job.id for job in retried], status=JobStatus.QUEUED)
        .order_by()
        .values_list("pk", flat=True)
    )
    for job in retried:
        if job.id in requeued:
            readmit(connection, job, now)


# --------------------------------------------------------------------------- one job


def cancel(scope_hash: str, job_id: str, *, now: datetime | None = None) -> CancelOutcome:
    """Queued -> Cancelled at once; Running -> cancel flag; the Failed job that halts
    its sequence -> Cancelled, and the sequence goes on; finished -> said so."""
    now = current_time(now)
    alias = alias_for(Job)
    connection = connection_for(Job)
    jobs = Job.objects.for_scope(scope_hash).filter(job_id=job_id)
    identity = {"scope_hash": scope_hash, "job_id": job_id}
    with transaction.atomic(using=alias):
        # A job can move from Queued to Running between the two updates; the loop
        # re-reads and tries again, so the outcome always matches the stored state.
        for _ in range(5):
            if run_moving(connection, sql_endings.CANCEL_QUEUED, identity, now, was=QUEUED):
                cancelled_queued_job(scope_hash, job_id, alias)
                return CancelOutcome.CANCELLED
            if jobs.filter(status=JobStatus.RUNNING).update(cancel_requested=True, updated_at=now):
                notify_cancel(connection)
                return CancelOutcome.REQUESTED
            found = jobs.values_list("status", "sequence_key").first()
            if found is None:
                raise JobNotFound()
            status, sequence_key = found
            if (
                status == JobStatus.FAILED
                and sequence_key is not None
                and _cancel_halting(connection, identity, sequence_key, now)
            ):
                return CancelOutcome.CANCELLED
            if JobStatus(status).is_finished:
                return CancelOutcome.ALREADY_FINISHED
    raise InvalidTransition(f"job {job_id!r} kept changing state; cancel again")


def cancel_queued(scope_hash: str, prefixes: Sequence[str], *, now: datetime | None = None) -> int:
    """Queued -> Cancelled for every job of scope ``scope_hash`` whose id starts with
    one of ``prefixes``: one guarded statement (per 100 prefixes) inside the caller's
    transaction (or its own); returns how many. For the library's own jobs, dropped
    with what they were for (the wake-ups of a finished workflow run): no
    ``queued_job_cancelled`` is sent, their owner ends nothing more. Running and
    finished jobs are left."""
    if not prefixes:
        return 0
    now = current_time(now)
    connection = connection_for(Job)
    cancelled = 0
    with transaction.atomic(using=alias_for(Job)):
        for start in range(0, len(prefixes), _PREFIXES_PER_STATEMENT):
            chunk = prefixes[start : start + _PREFIXES_PER_STATEMENT]
            params = {
                "scope_hash": scope_hash,
                **{f"prefix_{n}": prefix for n, prefix in enumerate(chunk)},
            }
            statement = sql_endings.cancel_queued_prefixed(len(chunk))
            # Final: what follows in their batches and sequences too.
            cancelled += len(run_moving(connection, statement, params, now, was=QUEUED))
    return cancelled


def cancel_running(scope_hash: str, prefixes: Sequence[str], *, now: datetime | None = None) -> int:
    """Running -> cancel requested for every job of scope ``scope_hash`` whose id
    starts with one of ``prefixes`` and was not asked yet: one guarded statement (per
    100 prefixes) inside the caller's transaction (or its own); returns how many.
    Their handlers see the request, and their finish ends them Cancelled, as
    :func:`cancel` does for one job; PostgreSQL workers are told on commit. For the
    library's own jobs, cancelled with what they were for (the items of a cancelled
    workflow run). Queued and finished jobs are left (see :func:`cancel_queued`)."""
    now = current_time(now)
    with transaction.atomic(using=alias_for(Job)):
        asked = _update_by_prefixes(
            scope_hash, prefixes, CANCEL_BY_REQUEST, cancel_requested=True, updated_at=now
        )
        if asked:
            notify_cancel(connection_for(Job))
    return asked


#: Prefixes per statement of :func:`cancel_queued` and :func:`cancel_running` (SQLite
#: bounds a statement's expression depth).
_PREFIXES_PER_STATEMENT = 100


def _update_by_prefixes(scope_hash: str, prefixes: Sequence[str], guard: Q, **fields: Any) -> int:
    """Write ``fields`` on every job of scope ``scope_hash`` that ``guard`` admits and
    whose id starts with one of ``prefixes``, one statement per
    :data:`_PREFIXES_PER_STATEMENT` of them, in one transaction: how many. (Not for a
    move into a final state: :func:`cancel_queued` follows up batches and sequences.)"""
    if not prefixes:
        return 0
    updated = 0
    with transaction.atomic(using=alias_for(Job)):
        for start in range(0, len(prefixes), _PREFIXES_PER_STATEMENT):
            chunk = prefixes[start : start + _PREFIXES_PER_STATEMENT]
            named = functools.reduce(operator.or_, (Q(job_id__startswith=p) for p in chunk))
            updated += Job.objects.for_scope(scope_hash).filter(named, guard).update(**fields)
    return updated


def _cancel_halting(
    connection: BaseDatabaseWrapper, identity: dict[str, str], sequence_key: str, now: datetime
) -> bool:
    """Failed -> Cancelled for the job of ``identity`` if it halts its sequence: the
    sequence goes on (its row locked first, then the next job released). False, changing
    nothing, if it does not halt it."""
    params = {**identity, "sequence_key": sequence_key, "now": adapt_dt(connection, now)}
    if not fetch(connection, sql_endings.UNHALT, params):
        return False
    return bool(
        run_moving(connection, sql_endings.CANCEL_FAILED, identity, now, was=JobStatus.FAILED.value)
    )


def retry(
    scope_hash: str,
    job_id: str,
    *,
    not_before: datetime | None = None,
    extra_attempts: int = 0,
    now: datetime | None = None,
) -> JobSnapshot:
    """Failed, Cancelled or Interrupted with attempts left -> Queued.

    ``extra_attempts`` raises ``max_attempts`` by that much in the same guarded
    statement, so an operator can grant more attempts to a job that used them all;
    ``max_attempts`` stays within its limit. Earlier attempts stay; progress, error,
    cancel flag, result and token are cleared. A job whose unique key another job of
    its scope holds now is refused (:class:`InvalidTransition`), as an operator asking
    for it would otherwise run the work twice. A job of a batch counts as pending in it
    again; one of a sequence waits behind the sequence's open jobs (the Failed job that
    halts its sequence goes first).
    """
    extra = _extra_attempts(extra_attempts)
    now = current_time(now)
    run_at = validation.optional_aware_utc(not_before, "not_before") or now
    alias = alias_for(Job)
    connection = connection_for(Job)
    jobs = Job.objects.for_scope(scope_hash).filter(job_id=job_id)
    with transaction.atomic(using=alias):
        # Its state before, held to the end of the transaction: a retry moves the job
        # out of a final state, in its batch's counts and its sequence.
        members = _members(jobs.select_for_update())
        chosen = jobs.filter(retry_guard(extra))
        updated, held_key = _requeue(chosen, _retry_fields(extra, run_at, now), alias)
        if updated:
            _readmit_requeued(connection, members, now)
        job = jobs.first()
        if job is None:
            raise JobNotFound()
        if held_key:
            raise InvalidTransition(
                f"job {job_id!r} cannot be queued again while another job of its scope "
                f"holds its unique key {job.unique_key!r}"
            )
        if not updated:
            if job.status not in RETRYABLE_STATUSES:
                raise InvalidTransition(
                    f"job {job_id!r} is {job.status}; only failed, cancelled or "
                    "interrupted jobs can be retried"
                )
            if job.max_attempts + extra > validation.MAX_ATTEMPTS_LIMIT:
                raise InvalidSubmission(
                    f"extra_attempts={extra} would raise max_attempts of job {job_id!r} "
                    f"to {job.max_attempts + extra}, above {validation.MAX_ATTEMPTS_LIMIT}"
                )
            raise InvalidTransition(
                f"job {job_id!r} has no attempts left "
                f"({job.attempt_count} of {job.max_attempts} used); "
                "grant more with extra_attempts"
            )
        if run_at <= now:
            notify(connection, job.queue)
    return snapshot(job)


# --------------------------------------------------------------------------- many jobs

#: The outcomes of the bulk operations, as :class:`ledon.bulk.BatchOutcome` counts them.
CANCELLED = "cancelled"
CANCEL_REQUESTED = "cancel requested"
REQUEUED = "re-queued"


def cancel_many(ids: Sequence[int], *, now: datetime | None = None) -> BatchOutcome:
    """Cancel the jobs of ``ids`` (primary keys) by :func:`cancel`'s rules, in one
    transaction of two guarded statements: Queued ones end Cancelled at once (each
    sends ``queued_job_cancelled`` on commit), Running ones are asked to stop,
    finished ones are left. On PostgreSQL a job another transaction holds (a claim,
    a finish) is skipped and returned as held (:func:`ledon.bulk.lock_batch`). What
    follows a Queued job's end in its batch and its sequence follows in the same
    transaction, as for :func:`cancel`."""
    now = current_time(now)
    alias = alias_for(Job)
    connection = connection_for(Job)
    with transaction.atomic(using=alias):
        ids, held = lock_batch(Job, ids)
        cancelled = 0
        for start in range(0, len(ids), CHUNK_ROWS):
            chunk = ids[start : start + CHUNK_ROWS]
            statement = sql_endings.cancel_queued_ids(len(chunk))
            params = {f"id_{n}": pk for n, pk in enumerate(chunk)}
            rows = run_moving(connection, statement, params, now, was=QUEUED)
            cancelled += len(rows)
            for row in sorted(rows, key=lambda row: row["id"]):
                cancelled_queued_job(row["scope_hash"], row["job_id"], alias)
        requested = Job.objects.filter(CANCEL_BY_REQUEST, pk__in=ids).update(
            cancel_requested=True, updated_at=now
        )
        if requested:
            notify_cancel(connection)
    return BatchOutcome(changed={CANCELLED: cancelled, CANCEL_REQUESTED: requested}, held=held)


def retry_many(
    ids: Sequence[int],
    *,
    extra_attempts: int = 0,
    not_before: datetime | None = None,
    now: datetime | None = None,
) -> BatchOutcome:
    """Retry the jobs of ``ids`` (primary keys) by :func:`retry`'s rules, granting
    each ``extra_attempts``, in one transaction and one guarded statement: Failed,
    Cancelled or Interrupted jobs with an attempt left (once granted) are queued again;
    the others are left, and so is a job whose unique key another job of its scope
    holds now (then the batch's jobs go one by one). Jobs of batches and sequences are
    followed up as :func:`retry` does. Held rows as for :func:`cancel_many`. A bad
    ``extra_attempts`` or ``not_before`` raises :class:`InvalidSubmission` and writes
    nothing."""
    extra = _extra_attempts(extra_attempts)
    now = current_time(now)
    run_at = validation.optional_aware_utc(not_before, "not_before") or now
    alias = alias_for(Job)
    connection = connection_for(Job)
    with transaction.atomic(using=alias):
        ids, held = lock_batch(Job, ids)
        chosen = Job.objects.filter(retry_guard(extra), pk__in=ids)
        queues = sorted(set(chosen.order_by().values_list("queue", flat=True)))
        requeued = 0
        if queues:
            members = _members(chosen)
            requeued, _ = _requeue(chosen, _retry_fields(extra, run_at, now), alias)
            _readmit_requeued(connection, members, now)
        if requeued and run_at <= now:
            for queue in queues:
                notify(connection, queue)
    return BatchOutcome(changed={REQUEUED: requeued}, held=held)


def cancel_preview(rows: QuerySet[Job]) -> Mapping[str, int]:
    """What :func:`cancel_many` would do to ``rows`` now, counted in one read: how many
    it would cancel, ask to stop, and leave (already asked, already finished)."""
    counts = rows.order_by().aggregate(
        cancelled=Count("pk", filter=CANCEL_AT_ONCE),
        requested=Count("pk", filter=CANCEL_BY_REQUEST),
        asked=Count("pk", filter=Q(status=JobStatus.RUNNING, cancel_requested=True)),
        finished=Count("pk", filter=Q(status__in=FINISHED_STATUSES)),
    )
    return {
        CANCELLED: counts["cancelled"],
        CANCEL_REQUESTED: counts["requested"],
        "cancel already requested": counts["asked"],
        "already finished": counts["finished"],
    }


def retry_preview(rows: QuerySet[Job], *, extra_attempts: int = 0) -> Mapping[str, int]:
    """What :func:`retry_many` granting ``extra_attempts`` would do to ``rows`` now,
    counted in one read: how many it would re-queue, and why it would leave the others
    (every attempt used — grant more —, the attempts limit, a state that is not
    retried)."""
    extra = _extra_attempts(extra_attempts)
    retryable = Q(status__in=RETRYABLE_STATUSES)
    counts = rows.order_by().aggregate(
        requeued=Count("pk", filter=retry_guard(extra)),
        used=Count("pk", filter=retryable & Q(attempt_count__gte=F("max_attempts") + extra)),
        limit=Count(
            "pk",
            filter=retryable
            & Q(attempt_count__lt=F("max_attempts") + extra)
            & Q(max_attempts__gt=validation.MAX_ATTEMPTS_LIMIT - extra),
        ),
        other=Count("pk", filter=~retryable),
    )
    return {
        REQUEUED: counts["requeued"],
        "used all their attempts (grant more)": counts["used"],
        f"would pass {validation.MAX_ATTEMPTS_LIMIT} attempts": counts["limit"],
        "not failed, cancelled or interrupted": counts["other"],
    }
