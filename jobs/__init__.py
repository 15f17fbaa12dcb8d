"""django-ledon jobs: durable, idempotent, token-fenced background jobs.

The scoped API (``submit_job``, ``stage_job``, ``JobScope``) and the handler API
(``job_handler``, ``JobContext``) are imported lazily so that listing ``"jobs"`` in
``INSTALLED_APPS`` never imports models before the app registry is ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import lazy_attributes

if TYPE_CHECKING:
    from .api import JobScope, stage_job, submit_job, submit_jobs
    from .handlers import JobContext, Snooze, job_handler
    from .schedules import periodic
    from .types import (
        CancelOutcome,
        FinishOutcome,
        JobSnapshot,
        JobStatus,
        JobSubmission,
        SubmitResult,
    )

__all__ = [
    "CancelOutcome",
    "FinishOutcome",
    "JobContext",
    "JobScope",
    "JobSnapshot",
    "JobStatus",
    "JobSubmission",
    "Snooze",
    "SubmitResult",
    "job_handler",
    "periodic",
    "stage_job",
    "submit_job",
    "submit_jobs",
]

_LAZY = {
    "JobScope": "api",
    "stage_job": "api",
    "submit_job": "api",
    "submit_jobs": "api",
    "JobContext": "handlers",
    "job_handler": "handlers",
    "Snooze": "handlers",
    "periodic": "schedules",
    "CancelOutcome": "types",
    "FinishOutcome": "types",
    "JobSnapshot": "types",
    "JobStatus": "types",
    "JobSubmission": "types",
    "SubmitResult": "types",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
