"""django-ledon jobs: durable, idempotent, token-fenced background jobs.

The scoped API (``submit_job``, ``stage_job``, ``JobScope``), the handler API
(``job_handler``, ``JobContext``) and the errors callers handle (``JobsError``, the
root of every error of the app) are imported lazily so that listing ``"jobs"`` in
``INSTALLED_APPS`` never imports models before the app registry is ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import exported, lazy_attributes

if TYPE_CHECKING:  # for type checkers; ``as`` marks each name as re-exported
    from .api import JobScope as JobScope
    from .api import stage_batch as stage_batch
    from .api import stage_job as stage_job
    from .api import submit_batch as submit_batch
    from .api import submit_job as submit_job
    from .api import submit_jobs as submit_jobs
    from .exceptions import JobCancelled as JobCancelled
    from .exceptions import JobIdentityConflict as JobIdentityConflict
    from .exceptions import JobsError as JobsError
    from .handlers import JobContext as JobContext
    from .handlers import Snooze as Snooze
    from .handlers import job_handler as job_handler
    from .schedules import periodic as periodic
    from .types import BatchSnapshot as BatchSnapshot
    from .types import CancelOutcome as CancelOutcome
    from .types import JobSnapshot as JobSnapshot
    from .types import JobStatus as JobStatus
    from .types import JobSubmission as JobSubmission
    from .types import SubmitResult as SubmitResult

_LAZY = exported(
    {
        "api": (
            "JobScope",
            "stage_batch",
            "stage_job",
            "submit_batch",
            "submit_job",
            "submit_jobs",
        ),
        "exceptions": ("JobCancelled", "JobIdentityConflict", "JobsError"),
        "handlers": ("JobContext", "Snooze", "job_handler"),
        "schedules": ("periodic",),
        "types": (
            "BatchSnapshot",
            "CancelOutcome",
            "JobSnapshot",
            "JobStatus",
            "JobSubmission",
            "SubmitResult",
        ),
    }
)
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
