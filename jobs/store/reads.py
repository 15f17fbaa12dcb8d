"""Reads of the job store: snapshots of one job, of a scope's jobs, due candidates."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from .. import validation
from ..exceptions import (
    InvalidInput,
)
from ..models import Job, JobAttempt
from ..types import (
    AttemptSnapshot,
    AttemptStatus,
    DueJob,
    JobSnapshot,
    JobStatus,
)
from .base import current_time


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


#: The fields of a :class:`DueJob`, read by these names from the job's columns.
_DUE_FIELDS = tuple(DueJob.__dataclass_fields__)


def get_due(
    *, limit: int = 100, queues: Sequence[str] | None = None, now: datetime | None = None
) -> list[DueJob]:
    """Due candidates across scopes, by priority (highest first) then time. Grants nothing."""
    validation.integer(limit, "limit", 0, 10_000)
    qs = Job.objects.due(current_time(now))
    if queues:
        qs = qs.filter(queue__in=list(queues))
    rows = qs.order_by("-priority", "next_run_at", "id").values(*_DUE_FIELDS)[:limit]
    return [DueJob(**row) for row in rows]
