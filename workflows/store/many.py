"""Cancel and resume many runs at once: one batch of a bulk operation by filter
(``manage.py bulk_workflows``, the admin's "all N matching" actions), in one short
transaction of set-based guarded statements, whatever the batch's size.

Each batch first takes the rows no other transaction holds (:func:`ledon.bulk.lock_batch`:
on PostgreSQL ``FOR UPDATE SKIP LOCKED``), so it never waits for a driver or a worker;
the rows another transaction holds are returned as held, to be tried again. The rules
are those of one run's :func:`~workflows.store.cancel` and
:func:`~workflows.store.resume`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Count, Q, QuerySet

from ledon.bulk import BatchOutcome, lock_batch

from ..exceptions import InvalidTransition
from ..models import WorkflowItem, WorkflowRun, WorkflowStep
from ..types import RunStatus, StepKind, StepStatus
from .base import alias, current_time, ended
from .control import ERASED_ON_RESUME, cancel_dependents_of, resume_run, resumed_fields
from .waking import drop_wakes, wake_many, wake_parent

#: The outcomes of the bulk operations, as :class:`ledon.bulk.BatchOutcome` counts them.
CANCELLED = "cancelled"
CANCEL_REQUESTED = "cancel requested"
RESUMED = "resumed"


def cancel_runs_many(ids: Sequence[int], *, now: datetime | None = None) -> BatchOutcome:
    """Cancel the runs of ``ids`` (primary keys) as :func:`~workflows.store.cancel`
    cancels one: Waiting runs end Cancelled at once (their queued wake-ups dropped,
    their parents woken), Running ones are asked to stop (they end Cancelled at
    their next checkpoint); the unfinished children and running items of both are
    cancelled with them. Finished runs are left."""
    now = current_time(now)
    with transaction.atomic(using=alias()):
        ids, held = lock_batch(WorkflowRun, ids)
        rows = WorkflowRun.objects.filter(pk__in=ids)
        waiting = list(rows.filter(status=RunStatus.WAITING).values_list("pk", flat=True))
        running = list(rows.filter(status=RunStatus.RUNNING).values_list("pk", flat=True))
        parents = list(
            rows.filter(pk__in=waiting, parent__isnull=False).values_list("parent_id", "parent_key")
        )
        cancelled = WorkflowRun.objects.filter(pk__in=waiting, status=RunStatus.WAITING).update(
            **ended(RunStatus.CANCELLED, now), cancel_requested=True, error=""
        )
        asked = WorkflowRun.objects.filter(pk__in=running, status=RunStatus.RUNNING).update(
            cancel_requested=True, updated_at=now
        )
        cancel_dependents_of(waiting + running, now)
        for parent_pk, parent_key in parents:
            wake_parent(parent_pk, parent_key, now)
        # After the parents' wakes: a parent cancelled in this batch keeps none.
        drop_wakes(waiting, now)
    return BatchOutcome(changed={CANCELLED: cancelled, CANCEL_REQUESTED: asked}, held=held)


def resume_runs_many(ids: Sequence[int], *, now: datetime | None = None) -> BatchOutcome:
    """Resume the Failed runs of ``ids`` (primary keys) as
    :func:`~workflows.store.resume` resumes one: their failed checkpoints are erased
    (their keys kept to be recorded again where they stood), their generation moves
    on and an advance job is queued for each. A run whose resume would fail the same
    way (:class:`~workflows.exceptions.ResumeWouldFail`) and runs that are not Failed
    are skipped.

    The runs whose failed checkpoint is a failed child's are resumed one by one
    first (their children with them, as one run's resume does; a child of the batch
    is then no longer Failed, and skipped); the others take a few statements however
    many: one read of their checkpoints, one update per distinct list of erased keys,
    one delete, one bulk insert of advance jobs."""
    now = current_time(now)
    with transaction.atomic(using=alias()):
        ids, held = lock_batch(WorkflowRun, ids)
        failed = dict(
            WorkflowRun.objects.filter(pk__in=ids, status=RunStatus.FAILED).values_list(
                "pk", "generation"
            )
        )
        steps = [
            _Step(*row)
            for row in WorkflowStep.objects.filter(run_id__in=failed)
            .filter(ERASED_ON_RESUME | _ONE_BY_ONE)
            .order_by("id")
            .values_list("pk", "run_id", "key", "kind", "status", "child__status")
        ]
        # A failed child goes with its parent; a map's results may be too large to
        # resume: both are rare, and take the one-run path, which knows them.
        one_by_one = {step.run_pk for step in steps if step.one_by_one}
        resumed = 0
        for run_pk in sorted(one_by_one):
            try:
                with transaction.atomic(using=alias()):
                    resume_run(run_pk, now)
            except InvalidTransition:  # ResumeWouldFail, or no longer Failed
                continue
            resumed += 1
        rest = set(failed) - one_by_one
        if one_by_one:  # a failed child of the batch resumed with its parent is Waiting
            rest &= set(
                WorkflowRun.objects.filter(pk__in=rest, status=RunStatus.FAILED).values_list(
                    "pk", flat=True
                )
            )
        runs = {pk: failed[pk] for pk in sorted(rest)}
        resumed += _resume_set(runs, [step for step in steps if step.run_pk in rest], now)
    return BatchOutcome(changed={RESUMED: resumed}, held=held)


#: The checkpoints that send a run down the one-run path of a resume.
_ONE_BY_ONE = Q(kind=StepKind.CHILD, status=StepStatus.FAILED, child__status=RunStatus.FAILED) | Q(
    kind=StepKind.MAP, status=StepStatus.RUNNING
)


@dataclass(frozen=True, slots=True)
class _Step:
    """A checkpoint of a Failed run that its resume erases, or that sends the run
    down the one-run path."""

    pk: int
    run_pk: int
    key: str
    kind: str
    status: str
    child_status: str | None

    @property
    def one_by_one(self) -> bool:
        if self.kind == StepKind.CHILD:
            return self.status == StepStatus.FAILED and self.child_status == RunStatus.FAILED
        return self.kind == StepKind.MAP and self.status == StepStatus.RUNNING


def _resume_set(runs: dict[int, int], erased: list[_Step], now: datetime) -> int:
    """Resume the Failed runs ``runs`` (primary key: generation; locked, none with a
    failed child or an unfinished map), erasing their checkpoints ``erased``, in the
    caller's transaction; how many."""
    if not runs:
        return 0
    keys: dict[int, list[str]] = {pk: [] for pk in runs}
    for step in erased:
        keys[step.run_pk].append(step.key)
    by_keys: dict[tuple[str, ...], list[int]] = {}
    for run_pk, run_keys in keys.items():
        by_keys.setdefault(tuple(run_keys), []).append(run_pk)
    resumed = 0
    for rerun_keys, pks in by_keys.items():
        resumed += WorkflowRun.objects.filter(pk__in=pks, status=RunStatus.FAILED).update(
            **resumed_fields(now), rerun_keys=list(rerun_keys)
        )
    # A failed map's or activity's items first, then the checkpoints: each one
    # statement, nothing left to cascade (no read of the rows to delete them).
    with_items = [step.pk for step in erased if step.kind in (StepKind.MAP, StepKind.ACTIVITY)]
    if with_items:
        WorkflowItem.objects.filter(step_id__in=with_items)._raw_delete(alias())
    WorkflowStep.objects.filter(pk__in=[step.pk for step in erased])._raw_delete(alias())
    wake_many([(pk, generation + 1) for pk, generation in runs.items()], "resume", now=now)
    return resumed


_FINISHED = "finished already"


def cancel_preview(rows: QuerySet[WorkflowRun]) -> Mapping[str, int]:
    """What :func:`cancel_runs_many` would do to ``rows`` now, counted in one read."""
    counts = rows.order_by().aggregate(
        waiting=Count("pk", filter=Q(status=RunStatus.WAITING)),
        running=Count("pk", filter=Q(status=RunStatus.RUNNING)),
        finished=Count("pk", filter=Q(status__in=RunStatus.finished())),
    )
    return {
        CANCELLED: counts["waiting"],
        CANCEL_REQUESTED: counts["running"],
        _FINISHED: counts["finished"],
    }


def resume_preview(rows: QuerySet[WorkflowRun]) -> Mapping[str, int]:
    """What :func:`resume_runs_many` would do to ``rows`` now, counted in one read (a
    Failed run whose resume would fail the same way is counted as resumed here, and
    skipped when its batch comes)."""
    counts = rows.order_by().aggregate(
        failed=Count("pk", filter=Q(status=RunStatus.FAILED)),
        other=Count("pk", filter=~Q(status=RunStatus.FAILED)),
    )
    return {RESUMED: counts["failed"], "not failed": counts["other"]}
