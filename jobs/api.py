"""The scoped, untrusted-caller side: submit, stage, read, list, cancel and retry jobs
of one scope. Nothing here can reach another scope."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from . import store, validation
from .exceptions import InvalidJobId, InvalidSubmission, UnknownHandler
from .store import batches
from .types import (
    BatchSnapshot,
    CancelOutcome,
    JobSnapshot,
    JobStatus,
    JobSubmission,
    SubmitResult,
)


def _submission(value: object) -> JobSubmission:
    if not isinstance(value, JobSubmission):
        raise InvalidSubmission(
            f"expected a JobSubmission (see JobSubmission.create), not {type(value).__name__}"
        )
    return value


def submit_job(scope: str, job_id: str | None, submission: JobSubmission) -> JobSnapshot:
    """Create a job in a short transaction of its own and return its snapshot.

    Idempotent per (scope, job_id): the identical request returns the existing job
    (``snapshot.created`` is False); a different request raises
    :class:`~jobs.exceptions.JobIdentityConflict`. Refuses to run inside
    ``transaction.atomic`` (:class:`~jobs.exceptions.AmbientTransactionError`): use
    :func:`stage_job` to make the job part of your transaction. ``job_id=None``
    generates one.
    """
    scope_hash = validation.scope_hash(scope)
    return store.submit(scope_hash, validation.job_id(job_id), _submission(submission))


def submit_jobs(
    items: Iterable[tuple[str, str | None, JobSubmission]],
) -> list[SubmitResult]:
    """Create many jobs in one short transaction of their own: bulk :func:`submit_job`.

    ``items`` are ``(scope, job_id, submission)`` triples. Returns one
    :class:`~jobs.types.SubmitResult` per item, in order: each item behaves as its own
    ``submit_job`` call made in that order — a new job is created, an identical
    request returns the existing job (also a repeat within the batch), and a
    different request for a taken identity reports its
    :class:`~jobs.exceptions.JobIdentityConflict` in ``result.conflict`` instead of
    raising (``result.job()`` raises it). Every item is validated before anything is
    written; invalid input raises and writes nothing. Refuses to run inside
    ``transaction.atomic`` like ``submit_job``.
    """
    hashes: dict[str, str] = {}
    checked: list[tuple[str, str, JobSubmission]] = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 3:
            raise InvalidSubmission("submit_jobs() takes (scope, job_id, submission) triples")
        scope, job_id, submission = item
        scope_hash = hashes.get(scope) if isinstance(scope, str) else None
        if scope_hash is None:
            scope_hash = hashes[scope] = validation.scope_hash(scope)
        checked.append((scope_hash, validation.job_id(job_id), _submission(submission)))
    return store.submit_many(checked)


def stage_job(scope: str, job_id: str | None, submission: JobSubmission) -> JobSnapshot:
    """Create a job inside the caller's open ``transaction.atomic`` block.

    The job exists if and only if that transaction commits. A conflicting request
    raises :class:`~jobs.exceptions.JobIdentityConflict` and marks the transaction
    for rollback, so the business work cannot commit even if the error is caught.
    """
    scope_hash = validation.scope_hash(scope)
    return store.stage(scope_hash, validation.job_id(job_id), _submission(submission))


#: The longest batch id: its ``then`` job's id, ``"<batch id>:then"``, is a job id.
MAX_BATCH_ID_LENGTH = validation.MAX_JOB_ID_LENGTH - len(batches.THEN_SUFFIX)


def _batch_id(value: object) -> str:
    batch_id = validation.existing_job_id(value)
    if len(batch_id) > MAX_BATCH_ID_LENGTH:
        raise InvalidJobId(f"a batch id is at most {MAX_BATCH_ID_LENGTH} characters")
    return batch_id


def _batch_jobs(jobs: object) -> list[tuple[str, JobSubmission]]:
    """``jobs`` checked: a non-empty list of ``(job_id, JobSubmission)`` pairs, each job
    id given once."""
    if isinstance(jobs, str | bytes) or not isinstance(jobs, Iterable):
        raise InvalidSubmission("a batch's jobs are a list of (job_id, JobSubmission) pairs")
    checked: list[tuple[str, JobSubmission]] = []
    seen: set[str] = set()
    for item in jobs:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidSubmission("a batch's jobs are (job_id, JobSubmission) pairs")
        job_id = validation.existing_job_id(item[0])
        if job_id in seen:
            raise InvalidSubmission(f"job id {job_id!r} is given twice in the batch")
        seen.add(job_id)
        submission = _submission(item[1])
        if submission.rules.unique_key is not None:
            raise InvalidSubmission(
                "a batch's jobs take no unique_key (nor debounce): submit such jobs one by"
                " one with submit_job or stage_job"
            )
        checked.append((job_id, submission))
    if not checked:
        raise InvalidSubmission("a batch needs at least one job")
    return checked


def _then(then: object) -> JobSubmission | None:
    """A batch's ``then``: None, or a submission without rules whose handler is known
    where the registry can tell (this process discovered its handlers, as a worker
    does)."""
    if then is None:
        return None
    submission = _submission(then)
    if submission.rules != store.NO_RULES:
        raise InvalidSubmission(
            "a batch's then takes no start deadline, unique_key, debounce or sequence_key"
        )
    # Not at the top: the registry imports the handlers' modules' context.
    from .handlers import knows_every_handler, registered_handlers

    known = {(spec.name, spec.version) for spec in registered_handlers()}
    if knows_every_handler() and (submission.handler, submission.handler_version) not in known:
        raise UnknownHandler(
            f"the batch's then names handler {submission.handler!r} version "
            f"{submission.handler_version}, which this process does not register"
        )
    return submission


def submit_batch(
    scope: str,
    batch_id: str,
    jobs: Iterable[tuple[str, JobSubmission]],
    *,
    then: JobSubmission | None = None,
) -> BatchSnapshot:
    """Create a batch of jobs in a short transaction of its own; returns its snapshot.

    ``jobs`` are ``(job_id, JobSubmission)`` pairs. ``then``, if given, is submitted
    exactly once, as job ``"<batch_id>:then"`` of the scope, in the transaction that
    makes the last job of the batch final (Succeeded, Failed, Cancelled, Interrupted
    or Expired); its handler reads the batch's counts as ``ctx.batch``. The same batch
    id with the same jobs returns the stored batch (``created`` False); other jobs
    raise :class:`~jobs.exceptions.BatchIdentityConflict`. An empty batch, a job id
    given twice and a ``then`` whose handler the registry does not know (where it can
    tell: a process that discovered its handlers, as a worker does) are refused,
    writing nothing. Refuses to run inside
    ``transaction.atomic``: use :func:`stage_batch`.
    """
    scope_hash = validation.scope_hash(scope)
    return store.submit_batch(scope_hash, _batch_id(batch_id), _batch_jobs(jobs), _then(then))


def stage_batch(
    scope: str,
    batch_id: str,
    jobs: Iterable[tuple[str, JobSubmission]],
    *,
    then: JobSubmission | None = None,
) -> BatchSnapshot:
    """:func:`submit_batch` inside the caller's open ``transaction.atomic`` block: the
    batch and its jobs exist if and only if that transaction commits. A conflict marks
    the transaction for rollback."""
    scope_hash = validation.scope_hash(scope)
    return store.stage_batch(scope_hash, _batch_id(batch_id), _batch_jobs(jobs), _then(then))


class JobScope:
    """Read and steer the jobs of one scope (tenant, account, user…)."""

    __slots__ = ("scope_hash",)

    def __init__(self, scope: str) -> None:
        self.scope_hash = validation.scope_hash(scope)

    @classmethod
    def _reserved(cls, name: str) -> JobScope:
        """The library's reserved scope ``name``: for trusted code only, through
        :func:`jobs.execution.reserved_scope`; never for a caller's string."""
        scope = cls.__new__(cls)
        scope.scope_hash = validation.reserved_scope_hash(name)
        return scope

    def __repr__(self) -> str:
        return f"<JobScope {self.scope_hash[:12]}…>"

    def submit(self, job_id: str | None, submission: JobSubmission) -> JobSnapshot:
        return store.submit(self.scope_hash, validation.job_id(job_id), _submission(submission))

    def submit_many(self, items: Iterable[tuple[str | None, JobSubmission]]) -> list[SubmitResult]:
        """Bulk :meth:`submit` of ``(job_id, submission)`` pairs; see :func:`submit_jobs`."""
        checked: list[tuple[str, str, JobSubmission]] = []
        for item in items:
            if not isinstance(item, tuple) or len(item) != 2:
                raise InvalidSubmission("submit_many() takes (job_id, submission) pairs")
            checked.append((self.scope_hash, validation.job_id(item[0]), _submission(item[1])))
        return store.submit_many(checked)

    def stage(self, job_id: str | None, submission: JobSubmission) -> JobSnapshot:
        return store.stage(self.scope_hash, validation.job_id(job_id), _submission(submission))

    def batch(self, batch_id: str) -> BatchSnapshot | None:
        """The batch's counts, or None if this scope has no such batch."""
        return store.get_batch(self.scope_hash, validation.existing_job_id(batch_id))

    def get(self, job_id: str) -> JobSnapshot | None:
        """The job with its attempts, or None if this scope has no such job."""
        return store.get(self.scope_hash, validation.existing_job_id(job_id))

    def list(
        self,
        *,
        status: JobStatus | str | Iterable[JobStatus | str] | None = None,
        queue: str | None = None,
        handler: str | None = None,
        limit: int | None = None,
    ) -> list[JobSnapshot]:
        """Every matching job of this scope, oldest first (all of them unless ``limit``)."""
        return store.list_jobs(
            self.scope_hash, status=status, queue=queue, handler=handler, limit=limit
        )

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a Queued job at once, or ask a Running job's handler to stop.

        Returns ``CancelOutcome.ALREADY_FINISHED`` for a finished job (a normal race);
        raises :class:`~jobs.exceptions.JobNotFound` if this scope has no such job.
        """
        return store.cancel(self.scope_hash, validation.existing_job_id(job_id))

    def retry(
        self,
        job_id: str,
        not_before: datetime | None = None,
        *,
        extra_attempts: int = 0,
    ) -> JobSnapshot:
        """Queue a Failed, Cancelled or Interrupted job again (attempts permitting).

        ``extra_attempts`` raises the job's ``max_attempts`` by that much in the same
        statement: the operator's way to re-run a job that used all its attempts.
        Raises :class:`~jobs.exceptions.InvalidTransition` from any other state or
        with no attempt left, :class:`~jobs.exceptions.InvalidSubmission` for a bad
        ``extra_attempts`` or ``not_before`` (nothing changes) and
        :class:`~jobs.exceptions.JobNotFound` if this scope has no such job.
        """
        return store.retry(
            self.scope_hash,
            validation.existing_job_id(job_id),
            not_before=not_before,
            extra_attempts=extra_attempts,
        )
