"""factory-boy factories for the values the job store accepts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import factory
from django.db import connection
from django.utils import timezone

from jobs.fair_share import place
from jobs.models import Job
from jobs.types import JobSubmission


class JobSubmissionFactory(factory.Factory):
    """A valid ``JobSubmission``, built through ``JobSubmission.create`` like a caller would.

    The defaults are constant, so two submissions built with the same arguments are the
    same request (a duplicate, not a conflict).
    """

    class Meta:
        model = JobSubmission

    handler = "reports.generate"
    payload = factory.LazyFunction(lambda: {"month": "2026-11"})
    version = 1
    queue = "default"
    max_attempts = 1
    not_before = None
    priority = 0

    @classmethod
    def _build(cls, model_class: type[JobSubmission], *args: Any, **kwargs: Any) -> JobSubmission:
        return model_class.create(*args, **kwargs)

    @classmethod
    def _create(cls, model_class: type[JobSubmission], *args: Any, **kwargs: Any) -> JobSubmission:
        return model_class.create(*args, **kwargs)


def write_job_rows(count: int, prefix: str, **fields: Any) -> datetime:
    """Write ``count`` job rows straight into the table and ``ANALYZE`` it: history for
    plan and index tests, too large to build through the store job by job. A field
    given as a callable gets the row's number; job ids are ``{prefix}-{n}``. Returns
    the rows' creation time."""
    now = timezone.now()
    defaults: dict[str, Any] = {
        "scope_hash": "a" * 64,
        "handler": "reports.generate",
        "handler_version": 1,
        "payload_json": "{}",
        "next_run_at": now,
        "created_at": now,
        "updated_at": now,
    }

    def value(field: Any, n: int) -> Any:
        return field(n) if callable(field) else field

    def row(n: int) -> Job:
        values = {**defaults, **{k: value(v, n) for k, v in fields.items()}}
        # Each row's place in line is its due time, as a queue in submission order has it.
        values.setdefault("fair_at", place(values["next_run_at"]))
        return Job(job_id=f"{prefix}-{n}", **values)

    Job.objects.bulk_create(row(n) for n in range(count))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    return now
