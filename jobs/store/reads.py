"""Reads of the job store: snapshots of one job, of a scope's jobs, due candidates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from .. import validation
from ..exceptions import InvalidInput
from ..models import Job, JobAttempt
from ..types import AttemptSnapshot, AttemptStatus, DueJob, JobSnapshot, JobStatus
from .base import current_time

#: The fields of a snapshot read from the job's columns of the same names (all but
#: ``created`` and ``attempts``), and those of an attempt's snapshot.
_JOB_FIELDS = tuple(
    name for name in JobSnapshot.__dataclass_fields__ if name not in ("created", "attempts")
)
_ATTEMPT_FIELDS = tuple(AttemptSnapshot.__dataclass_fields__)


def job_snapshot(
    values: Mapping[str, Any],
    *,
    created: bool = False,
    attempts: tuple[AttemptSnapshot, ...] = (),
) -> JobSnapshot:
    """The snapshot of a job from its columns' values, by name: a job read, or one
    just inserted."""
    fields = {name: values[name] for name in _JOB_FIELDS}
    fields["status"] = JobStatus(fields["status"])
    return JobSnapshot(**fields, created=created, attempts=attempts)


def snapshot(job: Job, *, created: bool = False, with_attempts: bool = False) -> JobSnapshot:
    """The snapshot of a job read through the ORM, with its attempts (oldest first)
    if asked."""
    attempts: tuple[AttemptSnapshot, ...] = ()
    if with_attempts:
        rows = JobAttempt.objects.filter(job=job).order_by("number").values(*_ATTEMPT_FIELDS)
        attempts = tuple(
            AttemptSnapshot(**{**row, "status": AttemptStatus(row["status"])}) for row in rows
        )
    values = {name: getattr(job, name) for name in _JOB_FIELDS}
    return job_snapshot(values, created=created, attempts=attempts)


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
        qs = qs.filter(status__in=_statuses(status))
    # A name no job can have (a lone surrogate, not a str) is a typed error here,
    # never the driver's encoding error.
    if queue is not None:
        qs = qs.filter(queue=validation.name(queue, "queue", validation.MAX_QUEUE_LENGTH))
    if handler is not None:
        qs = qs.filter(handler=validation.name(handler, "handler"))
    qs = qs.order_by("created_at", "id")
    if limit is not None:
        validation.integer(limit, "limit", 0, 10**9)
        qs = qs[:limit]
    return [snapshot(job) for job in qs]


def _statuses(status: object) -> list[str]:
    """``status`` of :func:`list_jobs` as a list of statuses: one status (a
    :class:`JobStatus` or its value), or an iterable of them. Anything else is an
    :class:`~jobs.exceptions.InvalidInput` naming what was given."""
    if isinstance(status, str):
        wanted: list[object] = [status]
    elif isinstance(status, Iterable) and not isinstance(status, bytes | bytearray | Mapping):
        wanted = list(status)
    else:
        raise InvalidInput(
            "status must be a job status or an iterable of job statuses, "
            f"not {type(status).__name__}"
        )
    for value in wanted:
        if not isinstance(value, str):
            raise InvalidInput(f"a job status is a str, not {type(value).__name__}")
        if value not in JobStatus.values:
            raise InvalidInput(f"unknown job status {value!r}")
    return [str(value) for value in wanted]


#: The fields of a :class:`DueJob`, read by these names from the job's columns.
_DUE_FIELDS = tuple(DueJob.__dataclass_fields__)


def get_due(
    *, limit: int = 100, queues: Sequence[str] | None = None, now: datetime | None = None
) -> list[DueJob]:
    """Due candidates across scopes, by priority (highest first) then place in line
    (see :mod:`jobs.fair_share`). Grants nothing."""
    validation.integer(limit, "limit", 0, 10_000)
    qs = Job.objects.due(current_time(now))
    if queues:
        qs = qs.filter(queue__in=list(queues))
    rows = qs.order_by("-priority", "fair_at", "id").values(*_DUE_FIELDS)[:limit]
    return [DueJob(**row) for row in rows]
