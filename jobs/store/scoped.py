"""The transitions a scope's caller and the admin ask for: cancel and retry."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from datetime import datetime

from django.db import transaction
from django.db.models import F, Q

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
    RETRYABLE_STATUSES,
    CancelOutcome,
    JobSnapshot,
    JobStatus,
)
from .base import current_time, notify, notify_cancel, requeue_fields
from .reads import snapshot


def cancel(scope_hash: str, job_id: str, *, now: datetime | None = None) -> CancelOutcome:
    """Queued -> Cancelled at once; Running -> cancel flag; finished -> said so."""
    now = current_time(now)
    alias = alias_for(Job)
    jobs = Job.objects.for_scope(scope_hash).filter(job_id=job_id)
    with transaction.atomic(using=alias):
        # A job can move from Queued to Running between the two updates; the loop
        # re-reads and tries again, so the outcome always matches the stored state.
        for _ in range(5):
            if jobs.filter(status=JobStatus.QUEUED).update(
                status=JobStatus.CANCELLED, finished_at=now, updated_at=now
            ):
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
    if not prefixes:
        return 0
    now = current_time(now)
    cancelled = 0
    with transaction.atomic(using=alias_for(Job)):
        for start in range(0, len(prefixes), _PREFIXES_PER_STATEMENT):
            chunk = prefixes[start : start + _PREFIXES_PER_STATEMENT]
            named = functools.reduce(operator.or_, (Q(job_id__startswith=p) for p in chunk))
            cancelled += (
                Job.objects.for_scope(scope_hash)
                .filter(named, status=JobStatus.QUEUED)
                .update(status=JobStatus.CANCELLED, finished_at=now, updated_at=now)
            )
    return cancelled


#: Prefixes per statement of :func:`cancel_queued` (SQLite bounds a statement's
#: expression depth).
_PREFIXES_PER_STATEMENT = 100


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
    cancel flag, result and token are cleared.
    """
    extra = validation.integer(extra_attempts, "extra_attempts", 0, validation.MAX_ATTEMPTS_LIMIT)
    now = current_time(now)
    run_at = validation.optional_aware_utc(not_before, "not_before") or now
    alias = alias_for(Job)
    jobs = Job.objects.for_scope(scope_hash).filter(job_id=job_id)
    granted = F("max_attempts") + extra
    fields = requeue_fields(run_at, now)
    if extra:
        fields["max_attempts"] = granted
        fields["granted_attempts"] = F("granted_attempts") + extra
    with transaction.atomic(using=alias):
        updated = jobs.filter(
            status__in=RETRYABLE_STATUSES,
            attempt_count__lt=granted,
            max_attempts__lte=validation.MAX_ATTEMPTS_LIMIT - extra,
        ).update(**fields)
        job = jobs.first()
        if job is None:
            raise JobNotFound()
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
