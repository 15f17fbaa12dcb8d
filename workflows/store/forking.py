"""Forking a run: a new run of the same workflow and input whose checkpoints reached
before a given step are copies of the source's, so that its body goes on from there.

The copy is a few bulk statements whatever the run's length: the run row, one
``INSERT … SELECT`` of the checkpoints before the step (finished ones: Succeeded or
Failed; one still open is left out and runs again, its key kept in the new run's
``rerun_keys`` so that reaching it skips nothing), one of their map items, and, for
each copied child checkpoint, its child run copied whole under the new run's id.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction

from ..exceptions import InvalidTransition, RunExists, RunNotFound, StepNotFound
from ..models import WorkflowItem, WorkflowRun, WorkflowStep
from ..observability import hooks
from ..types import FINISHED_STEP_STATUSES, RunSnapshot, RunStatus, StepKind, WaitKind
from ..validation import child_run_id
from .base import alias, current_time, run_in_scope
from .deadlines import stage_deadline
from .reads import snapshot
from .waking import wake

#: The checkpoint columns a fork copies as they are (the run and the child are
#: set by the copy).
_STEP_COLUMNS = (
    "key",
    "kind",
    "status",
    "attempts",
    "result_json",
    "error_type",
    "error",
    "wake_at",
    "item_count",
    "started_at",
    "finished_at",
)
#: The kinds of checkpoint that have items.
_WITH_ITEMS = (StepKind.MAP, StepKind.ACTIVITY)
_ITEM_COLUMNS = (
    "index",
    "status",
    "attempts",
    "args_json",
    "result_json",
    "error_type",
    "error",
    "job_id",
    "started_at",
    "finished_at",
)


def fork(
    scope_hash: str,
    run_id: str,
    new_run_id: str,
    from_step: str,
    version: int | None,
    timeout: float | None = None,
    *,
    now: datetime | None = None,
) -> RunSnapshot:
    """Fork run ``run_id`` of the scope into ``new_run_id`` from checkpoint
    ``from_step`` (see the module docstring), on ``version`` (None: the source's),
    with a deadline ``timeout`` seconds from now (None: none), and queue its first
    advance. A run being advanced is
    :class:`~workflows.exceptions.InvalidTransition`, a step the source never reached
    :class:`~workflows.exceptions.StepNotFound`, a taken run id
    :class:`~workflows.exceptions.RunExists`; each writes nothing."""
    now = current_time(now)
    with transaction.atomic(using=alias()):
        source = run_in_scope(scope_hash, run_id, lock=True)
        if source.status == RunStatus.RUNNING:
            raise InvalidTransition(
                f"run {run_id!r} is being advanced; fork it once it waits or has ended"
            )
        cut = (
            WorkflowStep.objects.filter(run_id=source.pk, key=from_step)
            .values_list("pk", flat=True)
            .first()
        )
        if cut is None:
            raise StepNotFound(f"run {run_id!r} never reached a checkpoint {from_step!r}")
        before = WorkflowStep.objects.filter(run_id=source.pk, pk__lt=cut)
        left_out = list(
            before.exclude(status__in=FINISHED_STEP_STATUSES)
            .order_by("pk")
            .values_list("key", flat=True)
        )
        rerun_keys = list(left_out)
        if source.rerun_keys:
            # Keys the source's last resume erased and has not recorded again before
            # the step: the fork records them again where they stood, as it would.
            copied = set(before.values_list("key", flat=True)) - set(left_out)
            rerun_keys += [
                key for key in source.rerun_keys if key not in copied and key not in left_out
            ]
        forked = _insert_run(
            scope_hash=scope_hash,
            run_id=new_run_id,
            name=source.name,
            version=source.version if version is None else version,
            input_json=source.input_json,
            status=RunStatus.WAITING,
            wait_kind=WaitKind.START,
            rerun_keys=rerun_keys,
            tags=source.tags,
            created_at=now,
            updated_at=now,
            deadline=None if timeout is None else now + timedelta(seconds=timeout),
        )
        _copy_steps(source.pk, forked.pk, cut)
        _copy_children(source.pk, forked, now)
        wake(forked.pk, 0, "start", now=now)
        stage_deadline(forked.pk, 0, forked.deadline, now)
        transaction.on_commit(lambda: hooks.started(forked.name, forked.version), using=alias())
        return snapshot(forked, created=True)


def identity(scope_hash: str, run_id: str) -> tuple[str, int]:
    """The workflow name and version of run ``run_id`` of the scope
    (:class:`~workflows.exceptions.RunNotFound` if there is none)."""
    row = (
        WorkflowRun.objects.for_scope(scope_hash)
        .filter(run_id=run_id)
        .values_list("name", "version")
        .first()
    )
    if row is None:
        raise RunNotFound(f"no run {run_id!r} in this scope")
    return row


def _copy_steps(source_pk: int, target_pk: int, cut: int | None) -> None:
    """Copy run ``source_pk``'s checkpoints (those before checkpoint ``cut`` and
    finished; None: all of them) to run ``target_pk``, in the order recorded, and
    their map items; child checkpoints point at no child yet."""
    connection = connections[alias()]
    quote = connection.ops.quote_name
    steps = quote(WorkflowStep._meta.db_table)
    items = quote(WorkflowItem._meta.db_table)
    condition = "run_id = %s"
    params: list[Any] = [target_pk, source_pk]
    if cut is not None:
        statuses = ", ".join("%s" for _ in FINISHED_STEP_STATUSES)
        condition += f" AND id < %s AND status IN ({statuses})"
        params += [cut, *(str(status) for status in FINISHED_STEP_STATUSES)]
    step_columns = ", ".join(quote(column) for column in _STEP_COLUMNS)
    item_columns = ", ".join(quote(column) for column in _ITEM_COLUMNS)
    key = quote("key")
    source_items = ", ".join(f"i.{quote(column)}" for column in _ITEM_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {steps} (run_id, {step_columns}) "
            f"SELECT %s, {step_columns} FROM {steps} WHERE {condition} ORDER BY id",
            params,
        )
        if not WorkflowStep.objects.filter(run_id=target_pk, kind__in=_WITH_ITEMS).exists():
            return
        cursor.execute(
            f"INSERT INTO {items} (step_id, {item_columns}) "
            f"SELECT n.id, {source_items} FROM {items} i "
            f"JOIN {steps} o ON i.step_id = o.id "
            f"JOIN {steps} n ON n.run_id = %s AND n.{key} = o.{key} "
            "WHERE o.run_id = %s ORDER BY i.id",
            [target_pk, source_pk],
        )


def _copy_children(source_pk: int, forked: WorkflowRun, now: datetime) -> None:
    """For each copied child checkpoint of ``forked`` (a copy of run ``source_pk``'s),
    a copy of the source's finished child run, whole and with its own children, under
    the fork's id; the checkpoint points at it."""
    keys = WorkflowStep.objects.filter(run_id=forked.pk, kind=StepKind.CHILD).values_list(
        "key", flat=True
    )
    sources = WorkflowStep.objects.filter(
        run_id=source_pk,
        kind=StepKind.CHILD,
        key__in=list(keys),
        child__status__in=RunStatus.finished(),
    ).select_related("child")
    for step in sources:
        assert step.child is not None  # the filter on its status
        child = _insert_run(
            scope_hash=forked.scope_hash,
            run_id=child_run_id(forked.run_id, step.key),
            name=step.child.name,
            version=step.child.version,
            input_json=step.child.input_json,
            output_json=step.child.output_json,
            status=step.child.status,
            error=step.child.error,
            failed_step=step.child.failed_step,
            parent=forked,
            parent_key=step.key,
            created_at=now,
            updated_at=now,
            finished_at=step.child.finished_at,
        )
        _copy_steps(step.child.pk, child.pk, None)
        _copy_children(step.child.pk, child, now)
        WorkflowStep.objects.filter(run_id=forked.pk, key=step.key).update(child=child)


def _insert_run(**fields: object) -> WorkflowRun:
    """Insert a run row (:class:`RunExists` if its id is taken in its scope)."""
    try:
        with transaction.atomic(using=alias()):
            return WorkflowRun.objects.create(**fields)
    except IntegrityError:
        raise RunExists(
            f"run {fields['run_id']!r} exists in this scope; a fork needs a new run id"
        ) from None
