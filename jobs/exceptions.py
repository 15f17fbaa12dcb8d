"""Errors raised by the jobs app. ``JobsError`` is their root; how to catch and raise
them is said once for every app, at :class:`ledon.errors.DocumentedError`."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.exceptions import ImproperlyConfigured

from ledon.errors import DocumentedError


class JobsError(DocumentedError):
    """An error of the jobs app."""


class InvalidInput(JobsError, ValueError):
    """The input is not valid."""


class InvalidScope(InvalidInput):
    """The scope must be a non-empty string of valid Unicode without control characters."""


class InvalidJobId(InvalidInput):
    """The job id must be a non-empty string of at most 200 printable characters."""


class InvalidPayload(InvalidInput):
    """The payload must be JSON: dicts with string keys, lists, strings, finite numbers,
    booleans and None."""


class InvalidSubmission(InvalidInput):
    """A field of the job submission is not valid."""


class CostOverRate(InvalidSubmission):
    """The job's cost is larger than a rate it falls under lets start at once (the
    rate's burst, else its count): it could never start. Lower the cost, or raise the
    rate's burst."""


class JobExpired(JobsError):
    """The job was not started by its start deadline (``start_by`` or ``start_within``):
    it never ran."""


class InvalidWeight(InvalidInput):
    """A scope's weight must be a number greater than 0 and at most 100."""


class JobIdentityConflict(JobsError):
    """A job with this id already exists in this scope with a different request."""

    def __init__(self, job_id: str, fields: Sequence[str]) -> None:
        self.job_id = job_id
        self.fields = tuple(fields)
        super().__init__(
            f"job {job_id!r} already exists in this scope with different "
            f"{', '.join(self.fields)}; submit the identical request or use another job id"
        )


class BatchIdentityConflict(JobsError):
    """A batch with this id already exists in this scope with other jobs (or another
    ``then``), or a job id of the batch is taken by a job outside it."""

    def __init__(self, batch_id: str, reason: str) -> None:
        self.batch_id = batch_id
        self.reason = reason
        super().__init__(
            f"batch {batch_id!r}: {reason}; submit the identical batch or use another batch id"
        )


class JobIdentityUnresolved(JobsError):
    """The job's identity is taken, yet the job holding it could not be read: it was
    deleted (by retention) each time it was looked for. Submit again."""

    def __init__(self, job_ids: Sequence[str]) -> None:
        self.job_ids = tuple(job_ids)
        named = ", ".join(repr(job_id) for job_id in self.job_ids[:5])
        noun = "job" if len(self.job_ids) == 1 else "jobs"
        super().__init__(
            f"{noun} {named}: identity conflict without a visible winner; submit again"
        )


class AmbientTransactionError(JobsError):
    """submit_job() runs in its own transaction and refuses to run inside an open
    transaction.atomic() block; use stage_job() to create the job as part of it."""


class TransactionRequiredError(JobsError):
    """stage_job() must be called inside a transaction.atomic() block; use
    submit_job() to create a job on its own."""


class JobNotFound(JobsError, LookupError):
    """No job with this id exists in this scope."""


class InvalidTransition(JobsError):
    """The job's current state does not allow this transition."""


class UnknownHandler(JobsError, LookupError):
    """No handler is registered under this name and version."""


class AttemptRowMissing(JobsError):
    """The running attempt's row is missing; the transition was rolled back."""


class JobsConfigurationError(JobsError, ImproperlyConfigured):
    """The JOBS setting is not valid."""


class TasksFrameworkMissing(JobsConfigurationError):
    """Django 5.2 has no django.tasks: jobs.backends needs the django-tasks backport
    there (pip install "django-ledon[tasks-backport]")."""


class JobCancelled(JobsError):
    """The job's cancellation was requested; the handler stopped cooperatively."""


class InvalidSchedule(JobsConfigurationError):
    """The schedule is not valid: check its cron expression or interval, time zone,
    name (unique), catch_up and payload."""


class ScheduleNotFound(JobsError, LookupError):
    """No schedule of this name is stored (no worker has seen its declaration yet)."""


class ScheduleNotDeclared(JobsError, LookupError):
    """This process declares no schedule of this name (an orphaned schedule cannot run)."""


class JobTimedOut(JobsError):
    """The attempt ran past its handler's timeout: its handler was signalled to
    stop at the timeout and the attempt failed after the grace period."""


class InvalidLimits(JobsConfigurationError):
    """A flow-control limit is not valid: max_running, max_running_per_scope and
    max_running_per_key are positive ints; rate and rate_per_key are (count, seconds) or
    (count, seconds, burst): a positive int, a number of seconds in (0, 86400] and a
    positive int."""
