"""Checkpoints: a run's recorded steps, read at every replay, written and moved on
inside the driver's fenced transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models.base import ModelState

from ledon.db import alias_for

from ..models import WorkflowRun, WorkflowStep
from ..types import (
    StepKind,
    StepStatus,
)
from .base import Driver


def load_steps(run: WorkflowRun) -> dict[str, WorkflowStep]:
    """The run's recorded checkpoints by key, read at the start of every advance.

    A replay reads every checkpoint of the run, thousands for a long one: the rows
    come as plain tuples and become model instances without ``Model.__init__`` (its
    per-field work and init signals cost more than the query); they are the same
    saved rows that ``from_db`` would build.
    """
    fields = [field.attname for field in WorkflowStep._meta.concrete_fields]
    using = alias_for(WorkflowStep)
    rows = WorkflowStep.objects.using(using).filter(run=run).order_by("id").values_list(*fields)
    steps: dict[str, WorkflowStep] = {}
    for row in rows:
        step = WorkflowStep.__new__(WorkflowStep)
        step.__dict__.update(zip(fields, row, strict=True))
        step._state = ModelState()
        step._state.adding = False
        step._state.db = using
        steps[step.key] = step
    return steps


def insert_step(
    driver: Driver,
    key: str,
    kind: StepKind,
    status: StepStatus,
    now: datetime,
    **fields: Any,
) -> WorkflowStep:
    """Record a new checkpoint (inside a transaction :func:`guard` fenced). The unique
    (run, key) makes a second recording of one key impossible whatever races."""
    finished = now if status in (StepStatus.SUCCEEDED, StepStatus.FAILED) else None
    return WorkflowStep.objects.create(
        run=driver.run,
        key=key,
        kind=kind,
        status=status,
        started_at=now,
        finished_at=finished,
        **fields,
    )


def update_step(step: WorkflowStep, expected: StepStatus, **fields: Any) -> bool:
    """Move a checkpoint from ``expected`` (inside a fenced transaction); False if it was not
    there any more."""
    changed = WorkflowStep.objects.filter(pk=step.pk, status=expected).update(**fields)
    if changed:
        for name, value in fields.items():
            setattr(step, name, value)
    return bool(changed)
