"""Checkpoints: a run's recorded steps, read at every replay, written and moved on
inside the driver's fenced transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields as fields_of
from dataclasses import replace
from datetime import datetime
from typing import Any

from ledon.values import from_row

from ..models import WorkflowStep
from ..types import Checkpoint, StepKind, StepStatus
from .base import Driver

#: What a checkpoint holds: the columns a replay reads, a move writes back.
_FIELDS = tuple(field.name for field in fields_of(Checkpoint))


def load_steps(run_pk: int) -> dict[str, Checkpoint]:
    """The recorded checkpoints of run ``run_pk`` by key, in the order recorded, read
    at the start of every advance (thousands for a long run: one query of plain
    tuples)."""
    rows = WorkflowStep.objects.filter(run_id=run_pk).order_by("id").values_list(*_FIELDS)
    steps: dict[str, Checkpoint] = {}
    for row in rows:
        step = _checkpoint(row)
        steps[step.key] = step
    return steps


def load_steps_of(run_pks: list[int]) -> dict[int, dict[str, Checkpoint]]:
    """:func:`load_steps` for several runs in one query: each run's checkpoints by
    key, in the order recorded (a run with none is missing)."""
    rows = (
        WorkflowStep.objects.filter(run_id__in=run_pks)
        .order_by("id")
        .values_list("run_id", *_FIELDS)
    )
    runs: dict[int, dict[str, Checkpoint]] = {}
    for run_pk, *fields in rows:
        step = _checkpoint(fields)
        runs.setdefault(run_pk, {})[step.key] = step
    return runs


def _checkpoint(row: Sequence[Any]) -> Checkpoint:
    pk, key, kind, status, attempts, result, error_type, error, wake_at, count, child = row
    return Checkpoint(
        pk=pk,
        key=key,
        kind=StepKind(kind),
        status=StepStatus(status),
        attempts=attempts,
        result_json=result,
        error_type=error_type,
        error=error,
        wake_at=wake_at,
        item_count=count,
        child_id=child,
    )


def insert_step(
    driver: Driver,
    key: str,
    kind: StepKind,
    status: StepStatus,
    now: datetime,
    **fields: Any,
) -> Checkpoint:
    """Record a new checkpoint (inside a transaction :func:`guard` fenced). The unique
    (run, key) makes a second recording of one key impossible whatever races."""
    step = WorkflowStep.objects.create(
        run_id=driver.run.pk,
        key=key,
        kind=kind,
        status=status,
        started_at=now,
        finished_at=now if status.is_finished else None,
        **fields,
    )
    return from_row(Checkpoint, step, kind=kind, status=status)


def update_step(step: Checkpoint, expected: StepStatus, **fields: Any) -> Checkpoint | None:
    """Move a checkpoint from ``expected`` (inside a fenced transaction): the
    checkpoint as it now stands, or None if it was not there any more (nothing
    written)."""
    if not WorkflowStep.objects.filter(pk=step.pk, status=expected).update(**fields):
        return None
    return replace(step, **{name: value for name, value in fields.items() if name in _FIELDS})
