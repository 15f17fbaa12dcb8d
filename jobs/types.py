"""Values that cross the store's boundary: statuses, submissions, snapshots, claims
and outcomes. All are immutable."""

from __future__ import annotations

import enum
import json
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Self

from django.db import models

from ledon.values import CancelOutcome as CancelOutcome
from ledon.values import FencedOutcome, from_row

from . import validation
from .conf import jobs_settings
from .exceptions import JobIdentityConflict
from .submit_rules import NO_RULES, SubmitRules, submit_rules


class JobStatus(models.TextChoices):
    """Every state a job can be in; ``docs/lifecycle.md`` lists the transitions."""

    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    INTERRUPTED = "interrupted", "Interrupted"
    #: Not started by its deadline (``start_by``/``start_within``): it never starts,
    #: and used no attempt.
    EXPIRED = "expired", "Expired"

    @property
    def is_finished(self) -> bool:
        """Whether the job has finished (see :data:`FINISHED_STATUSES`)."""
        return self in FINISHED_STATUSES


#: States from which ``retry`` may re-queue a job (attempts permitting).
RETRYABLE_STATUSES = (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED)
#: The one definition of "finished": every state but Queued and Running. Used by
#: ``JobStatus.is_finished``, ``Job.objects.finished()`` and the store's SQL.
FINISHED_STATUSES = (*RETRYABLE_STATUSES, JobStatus.SUCCEEDED, JobStatus.EXPIRED)


class AttemptStatus(models.TextChoices):
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    INTERRUPTED = "interrupted", "Interrupted"
    #: The handler raised ``Snooze``; the job was queued again for later and
    #: this execution did not count against ``max_attempts``.
    SNOOZED = "snoozed", "Snoozed"
    #: The worker gave the claim back unused (its shutdown stopped the handler, or
    #: the handler never started): the job was queued again and this execution did
    #: not count against ``max_attempts``.
    RELEASED = "released", "Released"


class ExecutionStatus(enum.Enum):
    """What a running attempt's token allows, as read by ``get_execution_status``."""

    ACTIVE = "active"
    CANCEL_REQUESTED = "cancel_requested"
    ENDED = "ended"


class FinishOutcome(FencedOutcome):
    """What a finishing call (complete, fail, interrupt, recover) did.

    ``STALE`` is falsy: the token was not current (late, unknown or already
    finished), and nothing changed.
    """

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    REQUEUED = "requeued"
    #: The handler is unknown to this worker; the job is Queued again for later
    #: and the claim did not count as an attempt.
    PUT_BACK = "put-back"
    #: The handler raised ``Snooze``; the job is Queued again for later and the
    #: execution did not count against ``max_attempts``.
    SNOOZED = "snoozed"
    #: The worker gave the claim back unused (graceful shutdown): the job is Queued
    #: again and the execution did not count against ``max_attempts``.
    RELEASED = "released"
    #: Recovery (the attempt's worker died, or outlived its shutdown's grace) reached
    #: ``JOBS["MAX_INTERRUPTIONS"]``: the job ended Interrupted as one that keeps
    #: killing its worker, and is not queued again.
    KEEPS_KILLING_WORKER = "keeps-killing-worker"
    STALE = "stale"


class CancelReason(enum.Enum):
    """Why a handler's cancellation signal was set (``JobContext.cancel_reason``)."""

    #: ``JobScope.cancel`` (or the backend's cancel) requested it; stored on the job.
    REQUESTED = "requested"
    #: The worker is shutting down; the attempt is re-queued, not failed.
    SHUTDOWN = "shutdown"
    #: The attempt ended elsewhere (recovered after a lost lease); whatever the
    #: handler does now changes nothing.
    LOST = "lost"
    #: The handler ran past its timeout; the attempt fails with ``JobTimedOut``.
    TIMEOUT = "timeout"


#: The fields whose exact equality makes a second submission a duplicate.
IDENTITY_FIELDS = (
    "handler",
    "handler_version",
    "payload_json",
    "queue",
    "priority",
    "max_attempts",
    "initial_not_before",
    "cost",
)


#: The JSON text :meth:`JobSubmission.create` serialised itself, while it builds the
#: submission: that exact object needs no second parse.
_SERIALISED: ContextVar[str | None] = ContextVar("serialised_payload", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSubmission:
    """What a caller asks for. Immutable; the payload is JSON text from the start.

    Build it with :meth:`create`, which serialises the payload at once and rejects
    anything that is not JSON. Two submissions are the same request when every
    field is equal, the JSON text byte for byte.
    """

    handler: str
    handler_version: int = 1
    payload_json: str = "null"
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 1
    initial_not_before: datetime | None = None
    #: Units counted against every rate the job falls under (1 to 1000).
    cost: int = 1
    #: Rules of who goes next (a start deadline…): not part of the identity.
    rules: SubmitRules = NO_RULES

    def __post_init__(self) -> None:
        if self.payload_json is not _SERIALISED.get():
            validation.check_payload_json(self.payload_json, jobs_settings().MAX_PAYLOAD_BYTES)
        object.__setattr__(
            self,
            "initial_not_before",
            _checked(
                self.handler,
                self.handler_version,
                self.queue,
                self.priority,
                self.max_attempts,
                self.initial_not_before,
                self.cost,
            ),
        )

    @classmethod
    def create(
        cls,
        handler: str,
        payload: Any = None,
        *,
        version: int = 1,
        queue: str = "default",
        max_attempts: int = 1,
        not_before: datetime | None = None,
        priority: int = 0,
        start_by: datetime | None = None,
        start_within: float | None = None,
        limit_key: str | None = None,
        unique_key: str | None = None,
        unique_while: str | None = None,
        unique_for: float | None = None,
        debounce: float | None = None,
        debounce_max: float | None = None,
        sequence_key: str | None = None,
        cost: int = 1,
    ) -> Self:
        """Validate and serialise a request; raises a :class:`~jobs.exceptions.JobsError`
        subclass for anything invalid.

        ``start_by`` (an aware datetime) or ``start_within`` (seconds after the submit):
        a job not started by then never starts; it ends Expired. ``limit_key``: the key
        ``max_running_per_key`` counts it under (checked like a job id). ``unique_key`` with
        ``unique_while`` ("queued", the default, or "active") or ``unique_for``
        (seconds): while a job of the scope holds the key, submitting another returns
        that job. ``debounce`` (seconds, with ``unique_key``): the job starts that long
        after the latest submission of a burst, with its payload, and never later than
        ``debounce_max`` seconds after the first. ``cost`` (1 to 1000): the units the
        job counts against every ``rate`` and ``rate_per_key`` it falls under; part of
        the request, as ``priority`` is. See ``docs/flow-control.md``.
        ``sequence_key`` (checked like a job id): the scope's jobs with that key start
        one at a time, in submission order; see ``docs/batches-and-sequences.md``."""
        payload_json = validation.serialise_payload(payload, jobs_settings().MAX_PAYLOAD_BYTES)
        rules = (
            NO_RULES
            if start_by is None
            and start_within is None
            and limit_key is None
            and unique_key is None
            and unique_while is None
            and unique_for is None
            and debounce is None
            and debounce_max is None
            and sequence_key is None
            else submit_rules(
                start_by=start_by,
                start_within=start_within,
                limit_key=limit_key,
                unique_key=unique_key,
                unique_while=unique_while,
                unique_for=unique_for,
                debounce=debounce,
                debounce_max=debounce_max,
                not_before=not_before,
                sequence_key=sequence_key,
            )
        )
        if cls is JobSubmission:
            # The fields checked as __post_init__ checks them and set through their
            # slots: no second parse of the JSON text just written, no frozen __init__
            # (a bulk submit's items are built here).
            not_before = _checked(handler, version, queue, priority, max_attempts, not_before, cost)
            sub = object.__new__(cls)
            (
                set_handler,
                set_version,
                set_payload,
                set_queue,
                set_priority,
                set_max,
                set_nb,
                set_cost,
            ) = _SUBMISSION_SETTERS
            set_handler(sub, handler)
            set_version(sub, version)
            set_payload(sub, payload_json)
            set_queue(sub, queue)
            set_priority(sub, priority)
            set_max(sub, max_attempts)
            set_nb(sub, not_before)
            set_cost(sub, cost)
            _set_rules(sub, rules)
            return sub
        # serialise_payload checked the payload and its size and wrote JSON text
        # without NUL characters: __post_init__ need not parse it again.
        serialised = _SERIALISED.set(payload_json)
        try:
            return cls(
                handler=handler,
                handler_version=version,
                payload_json=payload_json,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                initial_not_before=not_before,
                cost=cost,
                rules=rules,
            )
        finally:
            _SERIALISED.reset(serialised)

    @property
    def version(self) -> int:
        return self.handler_version

    @property
    def not_before(self) -> datetime | None:
        return self.initial_not_before

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)

    def differing_fields(self, other: JobSubmission) -> list[str]:
        return [f for f in IDENTITY_FIELDS if getattr(self, f) != getattr(other, f)]


def _checked(
    handler: object,
    version: object,
    queue: object,
    priority: object,
    max_attempts: object,
    not_before: object,
    cost: object,
) -> datetime | None:
    """Check a submission's fields but its payload; its not-before in UTC."""
    validation.name(handler, "handler")
    validation.integer(version, "version", 1, 2**31 - 1)
    validation.name(queue, "queue", validation.MAX_QUEUE_LENGTH)
    validation.integer(priority, "priority", validation.MIN_PRIORITY, validation.MAX_PRIORITY)
    validation.integer(max_attempts, "max_attempts", 1, validation.MAX_ATTEMPTS_LIMIT)
    validation.integer(cost, "cost", 1, validation.MAX_COST)
    return validation.optional_aware_utc(not_before, "not_before")


#: The slot setters of :class:`JobSubmission`'s fields, in their order (each of them
#: is part of a submission's identity).
_SUBMISSION_SETTERS = tuple(getattr(JobSubmission, name).__set__ for name in IDENTITY_FIELDS)
_set_rules = getattr(JobSubmission, "rules").__set__  # noqa: B009  (a slot's descriptor)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptSnapshot:
    """One execution of a job, as stored."""

    number: int
    status: AttemptStatus
    worker_id: str
    progress: float | None
    progress_message: str
    error: str
    result_ref: str | None
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSnapshot:
    """A job's state when it was read. ``created`` tells whether this call created it."""

    scope_hash: str
    job_id: str
    handler: str
    handler_version: int
    payload_json: str
    queue: str
    priority: int
    max_attempts: int
    initial_not_before: datetime | None
    next_run_at: datetime
    status: JobStatus
    attempt_count: int
    cancel_requested: bool
    progress: float | None
    progress_message: str
    error: str
    result_ref: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    #: When the job must have started by, or it ends Expired (None: no deadline).
    start_by: datetime | None = None
    #: The key it holds within its scope while it is Queued (or Running), or None.
    unique_key: str | None = None
    #: The key ``max_running_per_key`` and ``rate_per_key`` count it under ("" for none).
    limit_key: str = ""
    #: The batch it belongs to (``submit_batch``), or None.
    batch_id: str | None = None
    #: Its sequence within its scope (its jobs start one at a time), or None.
    sequence_key: str | None = None
    #: The units it counts against every rate it falls under.
    cost: int = 1
    #: Executions that ended in ``Snooze`` (never counted in ``attempt_count``);
    #: bounded by the handler's ``max_snoozes``.
    snooze_count: int = 0
    #: Attempts granted by retries (``extra_attempts``), included in ``max_attempts``.
    granted_attempts: int = 0
    #: Attempts recovered because their worker died or outlived its shutdown's grace
    #: (never counted in ``attempt_count``); bounded by ``JOBS["MAX_INTERRUPTIONS"]``.
    interruption_count: int = 0
    #: The job ended Interrupted because it reached ``JOBS["MAX_INTERRUPTIONS"]``: it
    #: keeps killing its worker. A retry clears it.
    keeps_killing_worker: bool = False
    created: bool = False
    attempts: tuple[AttemptSnapshot, ...] = field(default=())

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)

    @property
    def attempts_left(self) -> int:
        return max(self.max_attempts - self.attempt_count, 0)

    def submission(self) -> JobSubmission:
        """The submission this job was created from: the snapshot's fields, with
        ``max_attempts`` as submitted (the attempts retries granted taken off)."""
        submitted = from_row(JobSubmission, self, rules=NO_RULES)
        if self.granted_attempts:
            return replace(submitted, max_attempts=self.max_attempts - self.granted_attempts)
        return submitted


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSnapshot:
    """A batch's counts when it was read: ``total`` jobs, of which ``pending`` are not
    final yet and the others ended ``succeeded``, ``failed`` (Failed or Interrupted),
    ``cancelled`` or ``expired``. ``status`` is "open" while any job is pending, then
    "done"; ``then_job_id`` names its ``then`` job (None without one); ``created`` tells
    whether this call created the batch."""

    scope_hash: str
    batch_id: str
    total: int
    succeeded: int
    failed: int
    cancelled: int
    expired: int
    pending: int
    then_job_id: str | None
    created_at: datetime
    finished_at: datetime | None
    created: bool = False

    @property
    def status(self) -> str:
        """ "open" while a job of the batch is not final, "done" once every one is."""
        return "open" if self.pending else "done"


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitResult:
    """What ``submit_jobs`` did with one item of the batch, in the order given.

    Exactly one of ``snapshot`` and ``conflict`` is set: the created or already
    existing job (``snapshot.created`` tells which), or the identity conflict a
    ``submit_job`` call with the same arguments would have raised.
    """

    job_id: str
    snapshot: JobSnapshot | None
    conflict: JobIdentityConflict | None = None

    @property
    def created(self) -> bool:
        return self.snapshot is not None and self.snapshot.created

    def job(self) -> JobSnapshot:
        """The job's snapshot; raises the item's :class:`JobIdentityConflict` if any."""
        if self.conflict is not None:
            raise self.conflict
        assert self.snapshot is not None
        return self.snapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class DueJob:
    """A candidate returned by ``get_due``: it grants nothing until ``try_start``."""

    scope_hash: str
    job_id: str
    queue: str
    priority: int
    next_run_at: datetime
    handler: str
    handler_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """A started attempt: whoever holds ``token`` may report progress and finish it."""

    scope_hash: str
    job_id: str
    token: str
    attempt: int
    max_attempts: int
    handler: str
    handler_version: int
    payload_json: str
    queue: str
    worker_id: str
    lease_expires_at: datetime
    #: The submitter's trace context as stored (tracing), or None.
    trace_context: str | None = None
    #: When the job was due (its ``next_run_at``): the attempt's wait is measured from it.
    due_at: datetime | None = None
    #: When the attempt was claimed.
    started_at: datetime | None = None
    #: The job's sequence (``sequence_key``), or None: its finish releases the next.
    sequence_key: str | None = None

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)

    @property
    def attempts_left(self) -> int:
        return max(self.max_attempts - self.attempt, 0)
