"""Reads: runs and their checkpoints as frozen snapshots, in a fixed number of
queries however many runs."""

from __future__ import annotations

from collections.abc import Mapping

from django.db import transaction
from django.db.models import Count

from ledon.values import from_row

from ..models import WorkflowItem, WorkflowRun, WorkflowStep
from ..types import (
    Checkpoint,
    ChildRun,
    ItemCounts,
    RunSnapshot,
    RunStatus,
    StepKind,
    StepSnapshot,
    StepStatus,
    Wait,
    WaitKind,
)
from ..validation import from_json
from .base import alias
from .fanning import batch_counts, ended_by_jobs
from .tags import carrying


def _error_text(error_type: str, error: str) -> str:
    return f"{error_type}: {error}" if error_type else error


#: The kinds of checkpoint whose items a snapshot counts.
_WITH_ITEMS = (StepKind.MAP, StepKind.ACTIVITY)


#: What a snapshot reads of a checkpoint (plain tuples: a long run's thousands of
#: checkpoints are read without a model instance each).
_SNAPSHOT_FIELDS = (
    "pk",
    "run_id",
    "key",
    "kind",
    "status",
    "attempts",
    "result_json",
    "error_type",
    "error",
    "started_at",
    "finished_at",
    "wake_at",
    "item_count",
    "child__run_id",
)


def _read_batch() -> int:
    """How many runs one read of their checkpoints names (SQLite bounds the
    parameters of one statement)."""
    bound = transaction.get_connection(alias()).features.max_query_params
    return min(10_000, bound or 10_000)


def _steps_by_run(run_pks: list[int]) -> dict[int, tuple[StepSnapshot, ...]]:
    """The checkpoints of the runs ``run_pks``, each run's in the order reached: two
    queries however many runs (the checkpoints with their child runs' ids, then their
    items counted by checkpoint and status), per batch of :func:`_read_batch` runs."""
    found: dict[int, list[StepSnapshot]] = {pk: [] for pk in run_pks}
    batch = _read_batch()
    for start in range(0, len(run_pks), batch):
        pks = run_pks[start : start + batch]
        rows = list(
            WorkflowStep.objects.filter(run_id__in=pks)
            .order_by("id")
            .values_list(*_SNAPSHOT_FIELDS)
        )
        counted: dict[int, dict[str, int]] = {}
        with_items = [row[0] for row in rows if row[3] in _WITH_ITEMS]
        if with_items:
            for step_id, status, n in (
                WorkflowItem.objects.filter(step_id__in=with_items)
                .values_list("step_id", "status")
                .annotate(n=Count("id"))
                .order_by()
            ):
                counted.setdefault(step_id, {})[status] = n
            # A map that has not fanned in yet: its items as their jobs stand.
            running = StepStatus.RUNNING
            open_steps = [
                (row[0], row[1], row[12])
                for row in rows
                if row[3] in _WITH_ITEMS and row[4] == running
            ]
            counted.update(_as_jobs_stand(open_steps, counted))
        for (
            pk,
            run_pk,
            key,
            kind,
            status,
            attempts,
            result_json,
            error_type,
            error,
            started_at,
            finished_at,
            wake_at,
            item_count,
            child_run_id,
        ) in rows:
            counts = _counts(item_count, counted.get(pk, {})) if kind in _WITH_ITEMS else None
            found[run_pk].append(
                StepSnapshot(
                    key=key,
                    kind=StepKind(kind),
                    status=StepStatus(status),
                    attempts=attempts,
                    result=from_json(result_json),
                    error=_error_text(error_type, error),
                    started_at=started_at,
                    finished_at=finished_at,
                    wake_at=wake_at,
                    items=counts,
                    child_run_id=child_run_id,
                )
            )
    return {pk: tuple(steps) for pk, steps in found.items()}


def _as_jobs_stand(
    steps: list[tuple[int, int, int]], counted: dict[int, dict[str, int]]
) -> dict[int, dict[str, int]]:
    """The items of the open ``steps`` (step, run, item count), ``counted`` on their
    rows, counted as they stand with their jobs: from their jobs batch's counts, or
    (a map an older version queued) the rows whose jobs ended moved to how they
    ended."""
    if not steps:
        return {}
    scopes = dict(
        WorkflowRun.objects.filter(pk__in={run_pk for _, run_pk, _ in steps}).values_list(
            "pk", "scope_hash"
        )
    )
    stood = batch_counts([(pk, scopes[run_pk], count) for pk, run_pk, count in steps])
    by_scope: dict[str, list[int]] = {}
    for step_pk, run_pk, _ in steps:
        if step_pk not in stood:
            by_scope.setdefault(scopes[run_pk], []).append(step_pk)
    for scope_hash, step_pks in by_scope.items():
        for step_pk, ended in ended_by_jobs(step_pks, scope_hash).items():
            by_status = stood[step_pk] = dict(counted.get(step_pk, {}))
            for status, n in ended.items():
                by_status[status] = by_status.get(status, 0) + n
                by_status[StepStatus.RUNNING] = by_status.get(StepStatus.RUNNING, 0) - n
    return stood


def _counts(total: int, by_status: dict[str, int]) -> ItemCounts:
    return ItemCounts(
        total=total,
        succeeded=by_status.get(StepStatus.SUCCEEDED, 0),
        failed=by_status.get(StepStatus.FAILED, 0),
        running=by_status.get(StepStatus.RUNNING, 0),
        cancelled=by_status.get(StepStatus.CANCELLED, 0),
    )


def wait_of(run: WorkflowRun) -> Wait | None:
    """What ``run`` waits for, as its value (None: nothing)."""
    if not run.wait_kind:
        return None
    return Wait(kind=WaitKind(run.wait_kind), key=run.wait_key, until=run.wake_at)


def snapshot(
    run: WorkflowRun,
    *,
    created: bool = False,
    with_steps: bool = True,
    steps: tuple[StepSnapshot, ...] | None = None,
) -> RunSnapshot:
    """``run`` as a snapshot, with its checkpoints (read here unless ``steps`` are
    given, or none with ``with_steps`` False)."""
    if steps is None:
        steps = _steps_by_run([run.pk])[run.pk] if with_steps else ()
    wait = wait_of(run)
    # Items end without waking the run: the text counts them now, from the
    # checkpoint the run waits at.
    counts = next((step.items for step in steps if wait and step.key == wait.key), None)
    return RunSnapshot(
        scope_hash=run.scope_hash,
        run_id=run.run_id,
        name=run.name,
        version=run.version,
        status=RunStatus(run.status),
        input=from_json(run.input_json),
        output=from_json(run.output_json),
        error=run.error,
        failed_step=run.failed_step,
        waiting_for=wait.describe(counts) if wait is not None else "",
        wait=wait,
        created_at=run.created_at,
        finished_at=run.finished_at,
        cancel_requested=run.cancel_requested,
        tags=dict(run.tags),
        # The parent's own id, read through the row that links them: a child's key
        # may hold "/", so its run id cannot be split to find its parent.
        parent_run_id=run.parent.run_id if run.parent is not None else None,
        created=created,
        steps=steps,
    )


def get(scope_hash: str, run_id: str) -> RunSnapshot | None:
    run = (
        WorkflowRun.objects.for_scope(scope_hash)
        .filter(run_id=run_id)
        .select_related("parent")
        .first()
    )
    return None if run is None else snapshot(run)


def list_runs(
    scope_hash: str,
    *,
    status: str | None = None,
    name: str | None = None,
    limit: int | None = None,
    tags: Mapping[str, str] | None = None,
) -> list[RunSnapshot]:
    """The scope's runs, oldest first, with their checkpoints: three queries (the
    runs with their parents, the checkpoints, the items' counts), not one per run.
    ``tags``: only the runs carrying every pair."""
    rows = carrying(WorkflowRun.objects.for_scope(scope_hash), tags or {})
    rows = rows.order_by("created_at", "id")
    if status is not None:
        rows = rows.filter(status=RunStatus(status))
    if name is not None:
        rows = rows.filter(name=name)
    if limit is not None:
        rows = rows[:limit]
    runs = list(rows.select_related("parent"))
    steps = _steps_by_run([run.pk for run in runs])
    return [snapshot(run, steps=steps[run.pk]) for run in runs]


def in_flight_versions() -> list[tuple[str, int]]:
    """Every (name, version) with runs not finished (for the deploy check)."""
    return list(
        WorkflowRun.objects.unfinished()
        .values_list("name", "version")
        .distinct()
        .order_by("name", "version")
    )


def child_run(step: Checkpoint) -> ChildRun | None:
    """The child run a child checkpoint waits for, read fresh."""
    if step.child_id is None:
        return None
    child = WorkflowRun.objects.filter(pk=step.child_id).first()
    if child is None:
        return None
    return from_row(ChildRun, child, pk=child.pk, status=RunStatus(child.status))
