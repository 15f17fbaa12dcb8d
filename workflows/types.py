"""Values that cross the workflows app's boundary: statuses, snapshots, outcomes.

Snapshots are frozen, slotted, keyword-only dataclasses read from the store; they
never change after they are made and hold parsed JSON values.

The engine's own values come last (:class:`DrivenRun`, :class:`Checkpoint`,
:class:`Item`, :class:`ChildRun`): what the store hands the engine and the context,
frozen too, so that nothing outside the store changes a row's picture of itself.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import models

from ledon.values import CancelOutcome as CancelOutcome


class RunStatus(models.TextChoices):
    """Where a run stands.

    WAITING: not being advanced (a timer, a signal, activity items, a child run, a
    retry's back-off, or its first advance); RUNNING: a worker is advancing it;
    SUCCEEDED, FAILED and CANCELLED are final (but ``resume`` takes a Failed run back
    to WAITING).
    """

    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"

    @classmethod
    def finished(cls) -> frozenset[RunStatus]:
        return frozenset({cls.SUCCEEDED, cls.FAILED, cls.CANCELLED})

    @classmethod
    def unfinished(cls) -> frozenset[RunStatus]:
        return frozenset({cls.RUNNING, cls.WAITING})


class StepStatus(models.TextChoices):
    """Where a checkpoint stands: the same members as :class:`RunStatus`.

    RUNNING: an inline step's try or activity items are under way; WAITING: a timer,
    a signal, a child run or a retry's back-off; SUCCEEDED: recorded (its value is
    returned on every replay); FAILED: retries exhausted (``StepFailed`` on replay);
    CANCELLED: the run was cancelled while it stood there.
    """

    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"

    @property
    def is_finished(self) -> bool:
        """Whether the checkpoint is recorded for good (see :data:`FINISHED_STEP_STATUSES`)."""
        return self in FINISHED_STEP_STATUSES


#: The one definition of a finished checkpoint: Succeeded or Failed. A replay returns
#: its value or raises its failure; a Cancelled one is never replayed (its run ended).
FINISHED_STEP_STATUSES = (StepStatus.SUCCEEDED, StepStatus.FAILED)


class StepKind(models.TextChoices):
    """What a checkpoint is: the ``WorkflowContext`` method that recorded it."""

    STEP = "step", "Inline step"
    ACTIVITY = "activity", "Activity"
    MAP = "map", "Map"
    SLEEP = "sleep", "Timer"
    SIGNAL = "signal", "Signal"
    CHILD = "child", "Child run"
    NOW = "now", "Clock"
    #: A patch marker (``wf.patched``): the run took the new path of this patch.
    PATCH = "patch", "Patch"


class WaitKind(models.TextChoices):
    """What a Waiting run waits for. Stored with the key of the checkpoint it waits
    at and until when (:class:`Wait`); the text that says it is rendered from them."""

    #: Its first advance.
    START = "start", "start"
    #: Its first advance after a resume.
    RESUME = "resume", "resume"
    #: A new advance: the last one's job failed for good.
    ADVANCE = "advance", "a new advance"
    SIGNAL = "signal", "signal"
    TIMER = "timer", "timer"
    #: The items of a map or an activity.
    ITEMS = "items", "items"
    CHILD = "child", "child"
    #: The next try of an inline step.
    RETRY = "retry", "retry"


def iso(when: datetime) -> str:
    """A recorded time as text (UTC, ISO 8601)."""
    return when.astimezone(UTC).isoformat()


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """What a waiting run waits for: its :class:`WaitKind`, the key of the checkpoint
    it waits at (a signal's, a timer's, a map's, a child's, a retrying step's; ""
    for the run's own advances) and until when (a timer's time, a retry's, a signal
    wait's timeout; None if it waits for as long as it takes)."""

    kind: WaitKind
    key: str = ""
    until: datetime | None = None

    def describe(
        self, items: ItemCounts | None = None, *, at: Callable[[datetime], str] = iso
    ) -> str:
        """The text that says it: "signal approved", "timer until …", "12 of 50
        items" (``items``: the counts of the map it waits for), "child ship", "retry
        of reserve at …"; ``at`` writes a time (ISO 8601 by default)."""
        until = at(self.until) if self.until is not None else "?"
        match self.kind:
            case WaitKind.SIGNAL:
                return f"signal {self.key}"
            case WaitKind.TIMER:
                return f"timer until {until}"
            case WaitKind.ITEMS:
                if items is None:
                    return f"items of {self.key}"
                return f"{items.total - items.running} of {items.total} items"
            case WaitKind.CHILD:
                return f"child {self.key}"
            case WaitKind.RETRY:
                return f"retry of {self.key} at {until}"
            case WaitKind.ADVANCE:
                return "a new advance (the last one failed)"
        return str(self.kind.label)


class SignalOutcome(enum.StrEnum):
    """What :func:`workflows.send_signal` did."""

    #: The signal is recorded (and the run woken if it waits for it).
    DELIVERED = "delivered"
    #: The same signal with the same payload was recorded before: nothing changed.
    ALREADY_SENT = "already_sent"
    #: The run has finished: the signal is not recorded.
    RUN_FINISHED = "run_finished"


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemCounts:
    """A map's items by status (the picture's counts)."""

    total: int
    succeeded: int = 0
    failed: int = 0
    running: int = 0
    cancelled: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSnapshot:
    """One checkpoint of a run, as recorded."""

    key: str
    kind: StepKind
    status: StepStatus
    #: Tries of an inline step; tries of its item for an activity; 0 otherwise.
    attempts: int
    #: The parsed JSON value the checkpoint returns (None until it succeeded).
    result: Any
    #: "Type: message" of the error that failed the last try ("" if none).
    error: str
    started_at: datetime
    finished_at: datetime | None
    #: A timer's wake time, or when a step's next try is due.
    wake_at: datetime | None = None
    #: A map's (or an activity's) item counts; None for the other kinds.
    items: ItemCounts | None = None
    #: A child step's run id.
    child_run_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSnapshot:
    """A run and its checkpoints, in the order the body reached them."""

    scope_hash: str
    run_id: str
    name: str
    version: int
    status: RunStatus
    input: Any
    output: Any
    #: "Type: message" of the error that failed the run ("" if none).
    error: str
    #: The key of the checkpoint that failed the run: a step whose retries ran out,
    #: or a checkpoint that raised (bad arguments, a child run it could not start);
    #: "" if the body raised an error of its own, or the run did not fail.
    failed_step: str
    #: What a waiting run waits for: "signal approved", "timer until …",
    #: "12 of 50 items", "child ship", "retry of reserve at …" ("" otherwise):
    #: :attr:`wait` as text.
    waiting_for: str
    created_at: datetime
    finished_at: datetime | None
    cancel_requested: bool = False
    #: What a waiting run waits for, as data (None when it waits for nothing).
    wait: Wait | None = None
    parent_run_id: str | None = None
    #: Whether this call created the run (False: it existed with the same request).
    created: bool = False
    steps: tuple[StepSnapshot, ...] = field(default=())
    #: The business keys given at the start (``{"customer": "42"}``).
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status in RunStatus.finished()

    def step(self, key: str) -> StepSnapshot | None:
        """The checkpoint recorded under ``key``, if any."""
        return next((step for step in self.steps if step.key == key), None)


# -- the engine's values --------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DrivenRun:
    """A run as its driver took it: what one advance reads of the run's row."""

    pk: int
    scope_hash: str
    run_id: str
    name: str
    version: int
    input_json: str
    #: Resumes so far: part of the ids of the run's advance jobs.
    generation: int
    #: Advances so far, this one included.
    advances: int
    #: The keys the last resume erased, in the order they were recorded.
    rerun_keys: tuple[str, ...]
    parent_id: int | None
    parent_key: str
    #: When the run times out (None: never).
    deadline: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """One recorded checkpoint of a run, as a replay reads it (its JSON unparsed)."""

    pk: int
    key: str
    kind: StepKind
    status: StepStatus
    attempts: int
    result_json: str | None
    error_type: str
    error: str
    wake_at: datetime | None
    item_count: int
    child_id: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """One item of a map (or the one item of an activity step), as its job runs it
    and as the fan-in reads it."""

    pk: int
    step_id: int
    index: int
    status: StepStatus
    attempts: int
    args_json: str
    result_json: str | None
    error_type: str
    error: str
    job_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRun:
    """A child run as its parent's checkpoint reads it: how it stands or ended."""

    pk: int
    run_id: str
    status: RunStatus
    output_json: str | None
    error: str
