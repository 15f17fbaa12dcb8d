"""Tables of the workflows app: runs, their checkpoints, map items and signals.

Each table has a surrogate integer id (the admin needs one); the identities the
engine relies on are unique constraints: a run is (scope_hash, run_id), a checkpoint
is (run, key), an item is (step, index), a signal is (run, key). No state transition
lives here: :mod:`workflows.store` writes every change as a guarded statement.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models

from .types import RunStatus, StepKind, StepStatus, WaitKind
from .validation import MAX_RUN_ID_LENGTH


class RunQuerySet(models.QuerySet["WorkflowRun"]):
    """Read vocabulary of runs."""

    def for_scope(self, scope_hash: str) -> RunQuerySet:
        return self.filter(scope_hash=scope_hash)

    def unfinished(self) -> RunQuerySet:
        return self.filter(status__in=RunStatus.unfinished())

    def finished(self) -> RunQuerySet:
        return self.filter(status__in=RunStatus.finished())

    def finished_before(self, when: datetime) -> RunQuerySet:
        return self.finished().filter(finished_at__lt=when)


class WorkflowRun(models.Model):
    """One run of a workflow (name, version) with its input, status and output.

    ``driver_token`` fences the worker advancing the run: it is replaced by a guarded
    update when a worker takes the run, and every checkpoint write is guarded by it,
    so a stale driver records nothing. A run is taken from WAITING, or from RUNNING
    only by the advance job that holds it (``driver_job``, running again after its
    worker died); any other wake-up of a RUNNING run sets ``wake_pending``.
    ``generation`` counts resumes; it is part of the ids of the jobs that advance the
    run, so a resumed run gets fresh jobs.
    """

    scope_hash = models.CharField(max_length=64)
    run_id = models.CharField(max_length=MAX_RUN_ID_LENGTH)
    name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    input_json = models.TextField()
    output_json = models.TextField(null=True, blank=True)  # noqa: DJ001
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.WAITING)
    error = models.TextField(blank=True, default="")
    failed_step = models.CharField(max_length=200, blank=True, default="")
    #: What a Waiting run waits for (:class:`~workflows.types.WaitKind`; "" for
    #: nothing), at which checkpoint's key, and until when (``wake_at``: a timer's
    #: time, a retry's, a signal wait's timeout): data, rendered as text by the
    #: store's snapshots.
    wait_kind = models.CharField(max_length=16, choices=WaitKind.choices, blank=True, default="")
    wait_key = models.CharField(max_length=200, blank=True, default="")
    wake_at = models.DateTimeField(null=True, blank=True)
    driver_token = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001
    #: The advance job whose driver holds the run (it may take the run over when it
    #: runs again after its worker died).
    driver_job = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    #: Something woke the run while a driver held it: that driver replays once more
    #: instead of waiting.
    wake_pending = models.BooleanField(default=False)
    generation = models.PositiveIntegerField(default=0)
    advances = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    #: The keys of the checkpoints the last ``resume`` erased, in the order they were
    #: recorded: a replay records them again where they stood, so the checkpoints
    #: recorded after them do not count as skipped when it reaches them.
    rerun_keys = models.JSONField(default=list, blank=True)
    #: The caller's business keys (``{"customer": "42"}``: string keys and values,
    #: at most 16 pairs), given at the start and never changed: the run is found by
    #: them (on PostgreSQL through a GIN index of the containment operator).
    tags = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    parent_key = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    #: When the run ends Cancelled (``RunTimedOut``) if it has not finished: its
    #: creation plus its ``timeout``; None for a run without one.
    deadline = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope_hash", "run_id"], name="workflows_run_identity"),
        ]
        indexes = [
            models.Index(fields=["status", "name", "version"], name="workflows_run_status"),
            models.Index(fields=["status", "finished_at"], name="workflows_run_finished"),
            models.Index(fields=["scope_hash", "created_at"], name="workflows_run_scope"),
        ]
        verbose_name = "workflow run"

    def __str__(self) -> str:
        return f"{self.name} v{self.version} {self.run_id}"


class WorkflowStep(models.Model):
    """One checkpoint of a run under its key: what kind, where it stands, its
    recorded result (JSON text), and what a waiting checkpoint waits for."""

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps")
    key = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=StepKind.choices)
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    attempts = models.PositiveIntegerField(default=0)
    result_json = models.TextField(null=True, blank=True)  # noqa: DJ001
    error_type = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    #: A timer's wake time, a signal wait's deadline, or a step's next try.
    wake_at = models.DateTimeField(null=True, blank=True)
    #: A map's (or activity's) item count. Items end on their own rows only (no
    #: shared counter to contend on); the items left are counted from them.
    item_count = models.PositiveIntegerField(default=0)
    child = models.ForeignKey(
        WorkflowRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="workflows_step_identity"),
        ]
        verbose_name = "workflow step"

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


class WorkflowItem(models.Model):
    """One item of a map (or the one item of an activity step): its arguments, the
    job that runs it, and its recorded result."""

    step = models.ForeignKey(WorkflowStep, on_delete=models.CASCADE, related_name="items")
    index = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    attempts = models.PositiveIntegerField(default=0)
    args_json = models.TextField()
    result_json = models.TextField(null=True, blank=True)  # noqa: DJ001
    error_type = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    job_id = models.CharField(max_length=200)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["step", "index"], name="workflows_item_identity"),
        ]
        indexes = [
            # Every item's end asks whether any item of its step is still running:
            # one short index probe, however large the map.
            models.Index(
                fields=["step"],
                condition=models.Q(status=StepStatus.RUNNING),
                name="workflows_item_running",
            ),
        ]
        verbose_name = "workflow map item"

    def __str__(self) -> str:
        return f"item {self.index}"


class WorkflowSignal(models.Model):
    """A signal sent to a run under a key, kept until the run's wait reads it."""

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="signals")
    key = models.CharField(max_length=200)
    payload_json = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="workflows_signal_identity"),
        ]
        verbose_name = "workflow signal"

    def __str__(self) -> str:
        return f"signal {self.key}"
