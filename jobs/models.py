"""Tables of the jobs app. Reads only: every state change lives in :mod:`jobs.store`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.db.models import F, Q

from .types import FINISHED_STATUSES, AttemptStatus, JobStatus

if TYPE_CHECKING:
    from datetime import datetime


class JobQuerySet(models.QuerySet["Job"]):
    def for_scope(self, scope_hash: str) -> JobQuerySet:
        return self.filter(scope_hash=scope_hash)

    def queued(self) -> JobQuerySet:
        return self.filter(status=JobStatus.QUEUED)

    def running(self) -> JobQuerySet:
        # Every Running job holds a token; saying so lets PostgreSQL read the small
        # partial index of current tokens instead of the whole history.
        return self.filter(status=JobStatus.RUNNING, current_token__isnull=False)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=FINISHED_STATUSES)

    def due(self, now: datetime) -> JobQuerySet:
        """Claimable now: Queued, not held by its sequence, no cancel requested, due,
        attempts left, its start deadline (if any) not passed."""
        return self.filter(
            Q(start_by__isnull=True) | Q(start_by__gt=now),
            status=JobStatus.QUEUED,
            cancel_requested=False,
            sequence_held=False,
            next_run_at__lte=now,
            attempt_count__lt=F("max_attempts"),
        )

    def unpaused(self) -> JobQuerySet:
        """Not in a paused queue (the last of the claim's guards, ``jobs.store.sql.CLAIMABLE``)."""
        return self.exclude(queue__in=Queue.objects.filter(paused=True).values("name"))

    def lease_expired(self, now: datetime) -> JobQuerySet:
        return self.running().filter(lease_expires_at__lt=now)


class Job(models.Model):
    """One job, identified by (scope_hash, job_id).

    The surrogate ``id`` exists only because the admin cannot register composite
    primary keys; the identity is the unique constraint.
    """

    scope_hash = models.CharField(max_length=64)
    job_id = models.CharField(max_length=200)
    handler = models.CharField(max_length=200)
    handler_version = models.PositiveIntegerField()
    payload_json = models.TextField()
    queue = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    initial_not_before = models.DateTimeField(null=True, blank=True)
    next_run_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    attempt_count = models.PositiveIntegerField(default=0)
    # NULL, not "": the unique constraint applies only to tokens that exist.
    current_token = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    cancel_requested = models.BooleanField(default=False)
    progress = models.FloatField(null=True, blank=True)
    progress_message = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    # NULL means "no result"; an empty string is a result a handler may return.
    result_ref = models.TextField(null=True, blank=True)  # noqa: DJ001
    leased_by = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # When a worker first claimed this job without knowing its handler (or
    # version); cleared whenever the job is queued again for another reason.
    handler_unknown_since = models.DateTimeField(
        null=True, blank=True, help_text="First claimed by a worker without its handler."
    )
    # Executions that ended Snoozed. They do not count in attempt_count (nor
    # against max_attempts); an attempt row's number is attempt_count + snooze_count
    # + release_count + interruption_count.
    snooze_count = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Executions that snoozed (not counted as attempts).",
    )
    # Claims a worker gave back unused at its graceful shutdown (the handler stopped
    # by the shutdown, or never started). Not counted in attempt_count either; an
    # attempt row's number counts them too, so each release keeps its row.
    release_count = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Claims given back unused at a worker's shutdown (not counted as attempts).",
    )
    # Attempts that ended because their worker died or outlived its shutdown's grace
    # and were recovered (the crash budget). Not counted in attempt_count either; an
    # attempt row's number counts them too. Never reset: the budget is the job's.
    interruption_count = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Attempts recovered after their worker died or outlived its shutdown "
        "(not counted as attempts; JOBS['MAX_INTERRUPTIONS'] bounds them).",
    )
    # Set by the recovery that reached JOBS["MAX_INTERRUPTIONS"]: the job ended
    # Interrupted as one that keeps killing its worker. Cleared by a retry.
    keeps_killing_worker = models.BooleanField(
        "keeps killing its worker",
        default=False,
        db_default=False,
        help_text="Ended Interrupted because it keeps killing its worker.",
    )
    # Attempts an operator's retry granted (extra_attempts) on top of the submitted
    # max_attempts: the request this job was created from asked for max_attempts
    # less these, so a repeat of it is still the same request.
    granted_attempts = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Attempts granted by retries beyond the max_attempts submitted.",
    )

    # Tracing: the submitter's trace context (W3C headers as JSON), so that every
    # attempt's span is its child; NULL when tracing is off.
    trace_context = models.TextField(  # noqa: DJ001
        null=True, blank=True, help_text="The submitter's trace context (W3C headers, JSON)."
    )

    # The limit counters (``jobs_limitcounter`` keys, a JSON array) this job's current
    # or last execution counts in: set by the claim, read when the job leaves Running
    # to give the counts back. NULL when no counted limit applied to its claim.
    limit_keys = models.TextField(  # noqa: DJ001
        null=True, blank=True, help_text="The limit counters its execution counts in."
    )

    # The job's place in line, microseconds of virtual time: the claim takes due jobs by
    # priority, then this. In a fair queue the submit gives it from the scope's lane
    # (``jobs_lane``); otherwise, and for a job due later, it is ``next_run_at``. Rows
    # written straight into the table (fixtures, history) default to the front, in id
    # order.
    fair_at = models.BigIntegerField(
        default=0, db_default=0, help_text="Its place in line (virtual time, µs)."
    )

    # A start deadline: a job not started by then is never claimed, and the expiry
    # sweep ends it Expired. NULL: none.
    start_by = models.DateTimeField(null=True, blank=True, help_text="Must start by then.")
    # Uniqueness within the scope: while a job holds its key (see the constraints), a
    # submission with the key returns it. ``unique_while``: "queued", "active" (Queued
    # or Running), "for" (held in jobs_uniquehold for a time), or "" without a key.
    unique_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    unique_while = models.CharField(max_length=8, blank=True, default="", db_default="")
    # The key max_running_per_key and rate_per_key count it under, across scopes
    # ("": none).
    limit_key = models.CharField(max_length=200, blank=True, default="", db_default="")
    # The units it counts against every rate it falls under (part of its request).
    cost = models.PositiveIntegerField(
        default=1, db_default=1, help_text="Units counted against each rate it falls under."
    )
    # A debounced job's latest start: its burst's first submission + debounce_max.
    debounce_until = models.DateTimeField(null=True, blank=True)

    # The batch it belongs to, within its scope (``jobs_batch``), or NULL.
    batch_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # Its sequence within its scope (``jobs_sequence``): the scope's jobs with one key
    # start one at a time, in submission order. NULL: none.
    sequence_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # Queued but waiting for an earlier job of its sequence to end: out of the claim's
    # index until the statement that ends that job (or a retry, a cancel) releases it.
    sequence_held = models.BooleanField(
        default=False, db_default=False, help_text="Waits for an earlier job of its sequence."
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope_hash", "job_id"], name="jobs_job_identity"),
            models.UniqueConstraint(
                fields=["current_token"],
                condition=Q(current_token__isnull=False),
                name="jobs_job_current_token",
            ),
            models.CheckConstraint(
                condition=Q(status__in=JobStatus.values), name="jobs_job_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(attempt_count__lte=F("max_attempts")),
                name="jobs_job_attempts_within_max",
            ),
            models.CheckConstraint(
                condition=Q(cost__gte=1, cost__lte=1000), name="jobs_job_cost_range"
            ),
            # One Queued job per (scope, unique key) of the "queued" and "active" modes,
            # and one Queued or Running of the "active" mode: a racing second insert
            # waits for the first and yields (ON CONFLICT DO NOTHING).
            models.UniqueConstraint(
                fields=["scope_hash", "unique_key"],
                condition=Q(unique_while__in=["queued", "active"], status="queued"),
                name="jobs_job_unique_queued",
            ),
            models.UniqueConstraint(
                fields=["scope_hash", "unique_key"],
                condition=Q(unique_while="active", status__in=["queued", "running"]),
                name="jobs_job_unique_active",
            ),
        ]
        indexes = [
            # The line index: each queue's line of Queued jobs not held by a sequence,
            # in claim order (priority, then place in line). A claim reads each queue it
            # serves from its head (jobs.store.sql.in_line), and only as far as it takes
            # jobs, so that neither finished history nor the lines of paused or unserved
            # queues slow it down; a fair queue's newcomer takes its place after the head
            # of its line at its priority (jobs.store.sql_submit.RESERVE_LANE).
            models.Index(
                "queue",
                F("priority").desc(),
                "fair_at",
                "id",
                name="jobs_job_line_idx",
                condition=Q(status="queued", sequence_held=False),
            ),
            # A sequence's jobs that are not final, the held ones apart, in submission
            # order: whether one is Queued and unheld or Running, and the first held one
            # to release next, are each one probe (see jobs.store.sql_endings).
            models.Index(
                "scope_hash",
                "sequence_key",
                "sequence_held",
                "id",
                name="jobs_job_sequence_idx",
                condition=Q(status__in=["queued", "running"], sequence_key__isnull=False),
            ),
            # A batch's jobs (the admin's batch page).
            models.Index(
                "scope_hash",
                "batch_id",
                "id",
                name="jobs_job_batch_idx",
                condition=Q(batch_id__isnull=False),
            ),
            models.Index("scope_hash", "created_at", name="jobs_job_scope_created_idx"),
            # Queued jobs with a start deadline, by deadline: the expiry sweep's.
            models.Index(
                "start_by",
                name="jobs_job_start_by_idx",
                condition=Q(status="queued", start_by__isnull=False),
            ),
            # Finished history by age (retention: purge_jobs). Partial, so that claiming
            # a job (finished_at NULL) adds nothing to it.
            models.Index(
                "finished_at",
                name="jobs_job_finished_idx",
                condition=Q(finished_at__isnull=False),
            ),
        ]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.handler} {self.job_id} ({self.status})"


class JobAttempt(models.Model):
    """One execution of a job; identity (job, number); fenced by its ``token``."""

    # No index of its own: the (job, number) constraint's index starts with job_id.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts", db_index=False)
    number = models.PositiveIntegerField()
    token = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=AttemptStatus.choices, default=AttemptStatus.RUNNING
    )
    worker_id = models.CharField(max_length=200, blank=True, default="")
    progress = models.FloatField(null=True, blank=True)
    progress_message = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    # NULL means "no result"; an empty string is a result a handler may return.
    result_ref = models.TextField(null=True, blank=True)  # noqa: DJ001
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="jobs_attempt_identity"),
            # A constraint rather than unique=True, which on PostgreSQL would add a
            # second (pattern-matching) index that no query uses.
            models.UniqueConstraint(fields=["token"], name="jobs_attempt_token"),
        ]
        ordering = ["job", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of job {self.job_id} ({self.status})"


class Queue(models.Model):
    """A queue's persisted state — paused or not. A queue has a row once it has
    been paused (or resumed); limits live in ``JOBS["QUEUES"]``, not here."""

    name = models.CharField(max_length=100, unique=True)
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"queue {self.name}" + (" (paused)" if self.paused else "")


class LimitCounter(models.Model):
    """How many Running jobs count against one limit: ``handler:<name>`` or
    ``queue:<name>`` (``max_running``), or with ``:<scope hash>`` appended
    (``max_running_per_scope``). Changed only in the statements that claim under
    limits (which hold the key's lock) and that leave Running (which give counts
    back), so that a claim reads a limit's usage by key instead of counting jobs."""

    key = models.CharField(max_length=400, unique=True)
    running = models.BigIntegerField(default=0)
    # The limit as the last claim that counted here knew it: a claim that would take
    # the counter past it fails on the constraint below, changing nothing, and is
    # made again the exact way (see jobs.store.limits).
    cap = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(cap__isnull=True) | Q(running__lte=F("cap")),
                name="jobs_limitcounter_within_cap",
            )
        ]

    def __str__(self) -> str:
        return f"{self.key}: {self.running} running"


class RateBucket(models.Model):
    """The state of one rate: a handler's or a queue's (``handler:<name>``,
    ``queue:<name>``) or one limit key's under it (``…#<limit key>``). Read and
    changed by the claims alone, by key, in the statement that starts the jobs; times
    are nanoseconds since the epoch.

    With a burst, a token bucket kept as GCRA: ``tat``, the theoretical arrival time
    of the next unit; a claim of ``c`` units sets it to ``max(tat, now) + c × T`` (T:
    ``seconds / count``) and ``horizon`` to ``now + burst × T``; the constraint
    ``tat <= horizon`` refuses the statement that would start more than the bucket
    holds. Without, a sliding window: ``stamps``, the units started by start time
    (``[[time, units], …]``, kept until ``horizon``, an eighth of the window past its
    start), ``used`` the sum of those after ``window_start`` with the claim's, ``cap``
    the count; ``used <= cap`` refuses the statement that would put more in the
    window. ``ends``: when the row holds nothing any more (a full bucket, an empty
    window); rows past it are pruned."""

    key = models.CharField(max_length=400, unique=True)
    tat = models.BigIntegerField(null=True, blank=True)
    horizon = models.BigIntegerField(null=True, blank=True)
    stamps = models.JSONField(null=True, blank=True)
    used = models.BigIntegerField(null=True, blank=True)
    cap = models.BigIntegerField(null=True, blank=True)
    window_start = models.BigIntegerField(null=True, blank=True)
    ends = models.BigIntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                # NULL (a window's row) passes, as every CHECK does.
                condition=Q(tat__lte=F("horizon")),
                name="jobs_ratebucket_within_burst",
            ),
            models.CheckConstraint(
                condition=Q(used__lte=F("cap")),
                name="jobs_ratebucket_within_window",
            ),
        ]

    def __str__(self) -> str:
        return f"rate {self.key}"


class Lane(models.Model):
    """A scope's line in a fair queue: ``tail``, the place (virtual time, µs) its
    latest job was given; ``step``, how far apart its jobs are (the quantum over the
    scope's weight); ``taken``, how many places its latest submit took. Written by every
    submit of due jobs to a fair queue, under the row's lock, so that one scope's racing
    submits get distinct places."""

    queue = models.CharField(max_length=100)
    scope_hash = models.CharField(max_length=64)
    tail = models.BigIntegerField()
    step = models.BigIntegerField()
    taken = models.BigIntegerField()

    class Meta:
        verbose_name = "scope share"
        verbose_name_plural = "scope shares"
        constraints = [
            models.UniqueConstraint(fields=["queue", "scope_hash"], name="jobs_lane_identity")
        ]

    def __str__(self) -> str:
        return f"lane of {self.scope_hash[:12]}… in {self.queue}"


class UniqueHold(models.Model):
    """A unique key held for a time (``unique_for``): until ``until``, a submission of
    the scope with ``unique_key`` returns job ``job_id``. Taken over by the first
    submission after it ends."""

    scope_hash = models.CharField(max_length=64)
    unique_key = models.CharField(max_length=200)
    job_id = models.CharField(max_length=200)
    until = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["scope_hash", "unique_key"], name="jobs_uniquehold_identity"
            )
        ]

    def __str__(self) -> str:
        return f"{self.unique_key} held by {self.job_id} until {self.until}"


class ScopeWeight(models.Model):
    """A scope's share of the starts in every fair queue, relative to the default
    weight 1 (a scope without a row). Set by ``execution.set_scope_weight``."""

    scope_hash = models.CharField(max_length=64, unique=True)
    weight = models.FloatField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["scope_hash"]
        constraints = [
            models.CheckConstraint(
                condition=Q(weight__gt=0, weight__lte=100), name="jobs_scopeweight_range"
            )
        ]

    def __str__(self) -> str:
        return f"weight {self.weight:g} for {self.scope_hash[:12]}…"


class Batch(models.Model):
    """A batch of jobs of one scope (``submit_batch``): how many of its jobs are not
    final yet (``pending``) and how many ended each way, and the ``then`` job submitted
    in the transaction that ends the last of them. Changed by every statement that
    takes a member in or out of a final state, in that statement (see
    ``jobs.store.sql_endings``)."""

    scope_hash = models.CharField(max_length=64)
    batch_id = models.CharField(max_length=200)
    # The batch's jobs and its ``then``, as a digest: the same batch id with other
    # jobs is a conflict.
    digest = models.CharField(max_length=64)
    total = models.BigIntegerField()
    pending = models.BigIntegerField()
    succeeded = models.BigIntegerField(default=0)
    # Failed or Interrupted.
    failed = models.BigIntegerField(default=0)
    cancelled = models.BigIntegerField(default=0)
    expired = models.BigIntegerField(default=0)
    # The ``then`` submission (NULL handler: none), submitted as job
    # ``"<batch_id>:then"`` of the scope, or as ``then_job_id`` of ``then_scope_hash``
    # when trusted code staged it there (never through a scope's own API).
    then_scope_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    then_job_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    then_handler = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    then_version = models.PositiveIntegerField(null=True, blank=True)
    then_payload_json = models.TextField(null=True, blank=True)  # noqa: DJ001
    then_queue = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001
    then_priority = models.SmallIntegerField(null=True, blank=True)
    then_max_attempts = models.PositiveIntegerField(null=True, blank=True)
    then_cost = models.PositiveIntegerField(null=True, blank=True)
    then_not_before = models.DateTimeField(null=True, blank=True)
    trace_context = models.TextField(null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField()
    # When its last job ended (``pending`` reached 0; an operator's retry of a job
    # opens the batch again).
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "batches"
        ordering = ["-created_at", "-id"]
        constraints = [
            # No CHECK on the counts: the statements that change them are upserts in key
            # order (for their locks' order), whose proposed rows carry the changes.
            models.UniqueConstraint(fields=["scope_hash", "batch_id"], name="jobs_batch_identity"),
        ]
        indexes = [
            models.Index("created_at", name="jobs_batch_open_idx", condition=Q(pending__gt=0))
        ]

    def __str__(self) -> str:
        return f"batch {self.batch_id} ({self.pending} of {self.total} pending)"


class Sequence(models.Model):
    """A sequence of one scope (``sequence_key``): how many of its jobs are not final
    (``open``), and the Failed job that halts it (``halted_by``) when that job's handler
    declares ``sequence_halts_on_failure``. Its row's lock orders the submits that hold
    a job behind it and the statements that end its jobs and release the next."""

    scope_hash = models.CharField(max_length=64)
    sequence_key = models.CharField(max_length=200)
    open = models.BigIntegerField(default=0)
    halted_by = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    halted_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["scope_hash", "sequence_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["scope_hash", "sequence_key"], name="jobs_sequence_identity"
            ),
        ]
        indexes = [
            models.Index(
                "halted_at", name="jobs_sequence_halted_idx", condition=Q(halted_by__isnull=False)
            )
        ]

    def __str__(self) -> str:
        halted = f", halted by {self.halted_by}" if self.halted_by else ""
        return f"sequence {self.sequence_key} ({self.open} open{halted})"


# The schedules' table lives with the schedules (``jobs/schedules/``).
# The workers registry's table lives with the observability package.
from .observability.models import Dashboard, WorkerRecord  # noqa: E402, F401
from .schedules.models import Schedule  # noqa: E402, F401
