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
from django.db.models import Count, F, Q, QuerySet

from ledon.bulk import BatchOutcome, lock_batch
from ledon.db import alias_for, connection_for

from .. import validation
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
from .base import current_time, notify, notify_cancel, requeue_fields
from .reads import snapshot

# --------------------------------------------------------------------------- the rules

#: A cancel ends a Queued job at once: no attempt runs it.
CANCEL_AT_ONCE = Q(status=JobStatus.QUEUED)
#: A cancel asks a Running job to stop: its handler sees the flag, and its finish ends
#: it Cancelled. (A bulk cancel leaves a job already asked as it is.)
CANCEL_BY_REQUEST = Q(status=JobStatus.RUNNING, cancel_requested=False)


def _cancelled_fields(now: datetime) -> dict[str, Any]:
    return {"status": JobStatus.CANCELLED, "finished_at": now, "updated_at": now}


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


# --------------------------------------------------------------------------- one job


def cancel(scope_hash: str, job_id: str, *, now: datetime | None = None) -> CancelOutcome:
    """Queued -> Cancelled at once; Running -> cancel flag; finished -> said so."""
    now = current_time(now)
    alias = alias_for(Job)
    jobs = Job.objects.for_scope(scope_hash).filter(job_id=job_id)
    with transaction.atomic(using=alias):
        # A job can move from Queued to Running between the two updates; the loop
        # re-reads and tries again, so the outcome always matches the stored state.
        for _ in range(5):
            if jobs.filter(CANCEL_AT_ONCE).update(**_cancelled_fields(now)):
                cancelled_queued_job(scope_hash, job_id, alias)
                return CancelOutcome.CANCELLED
            if jobs.filter(status=JobStatus.RUNNING).update(cancel_requested=True, updated_at=now):
                notify_cancel(connection_for(Job))
                return CancelOutcome.REQUESTED
            status = jobs.values_list("status", flat=True).first()
            if status is None:
                raise JobNotFound()
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
    now = current_time(now)
    return _update_by_prefixes(scope_hash, prefixes, CANCEL_AT_ONCE, **_cancelled_fields(now))


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
    :data:`_PREFIXES_PER_STATEMENT` of them, in one transaction: how many."""
    if not prefixes:
        return 0
    updated = 0
    with transaction.atomic(using=alias_for(Job)):
        for start in range(0, len(prefixes), _PREFIXES_PER_STATEMENT):
            chunk = prefixes[start : start + _PREFIXES_PER_STATEMENT]
            named = functools.reduce(operator.or_, (Q(job_id__startswith=p) for p in chunk))
            updated += Job.objects.for_scope(scope_hash).filter(named, guard).update(**fields)
    return updated


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
    for it would otherwise run the work twice.
    """
    extra = _extra_attempts(extra_attempts)
    now = current_time(now)
    run_at = validation.optional_aware_utc(not_before, "not_before") or now
    alias = alias_for(Job)
    jobs = Job.objects.for_scope(scope_hash).filter(job_id=job_id)
    with transaction.atomic(using=alias):
        chosen = jobs.filter(retry_guard(extra))
        updated, held_key = _requeue(chosen, _retry_fields(extra, run_at, now), alias)
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
            notify(connection_for(Job), job.queue)
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
    a finish) is skipped and returned as held (:func:`ledon.bulk.lock_batch`)."""
    now = current_time(now)
    alias = alias_for(Job)
    with transaction.atomic(using=alias):
        ids, held = lock_batch(Job, ids)
        queued = list(
            Job.objects.filter(CANCEL_AT_ONCE, pk__in=ids)
            .order_by()
            .values_list("pk", "scope_hash", "job_id")
        )
        cancelled = 0
        if queued:
            cancelled = Job.objects.filter(
                CANCEL_AT_ONCE, pk__in=[pk for pk, _, _ in queued]
            ).update(**_cancelled_fields(now))
            for _, scope_hash, job_id in queued:
                cancelled_queued_job(scope_hash, job_id, alias)
        requested = Job.objects.filter(CANCEL_BY_REQUEST, pk__in=ids).update(
            cancel_requested=True, updated_at=now
        )
        if requested:
            notify_cancel(connection_for(Job))
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
    holds now (then the batch's jobs go one by one). Held rows as for
    :func:`cancel_many`. A bad
    ``extra_attempts`` or ``not_before`` raises :class:`InvalidSubmission` and writes
    nothing."""
    extra = _extra_attempts(extra_attempts)
    now = current_time(now)
    run_at = validation.optional_aware_utc(not_before, "not_before") or now
    alias = alias_for(Job)
    with transaction.atomic(using=alias):
        ids, held = lock_batch(Job, ids)
        chosen = Job.objects.filter(retry_guard(extra), pk__in=ids)
        queues = sorted(set(chosen.order_by().values_list("queue", flat=True)))
        requeued = 0
        if queues:
            requeued, _ = _requeue(chosen, _retry_fields(extra, run_at, now), alias)
        if requeued and run_at <= now:
            connection = connection_for(Job)
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
