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
from datetime import datetime

from django.db import transaction
from django.db.models import Count, F, Q, QuerySet

from ledon.bulk import BatchOutcome, lock_batch

from ..exceptions import InvalidTransition
from ..models import WorkflowRun, WorkflowStep
from ..types import RunStatus, StepKind, StepStatus, WaitKind
from .base import alias, current_time, ended
from .control import cancel_dependents_of, resume_run
from .waking import drop_wakes, wake_many, wake_parent

#: The outcomes of the bulk operations, as :class:`ledon.bulk.BatchOutcome` counts them.
CANCELLED = "cancelled"
CANCEL_REQUESTED = "cancel requested"
RESUMED = "resumed"

#: What a resume sets on a Failed run: waiting to be replayed, one generation on.
_RESUMED = {
    "status": RunStatus.WAITING,
    "cancel_requested": False,
    "error": "",
    "failed_step": "",
    "output_json": None,
    "wait_kind": WaitKind.RESUME,
    "wait_key": "",
    "finished_at": None,
}


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
            **ended(RunStatus.CANCELLED, now), cancel_requested=True
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
    many:
    one update per distinct list of erased keys, one delete, one bulk insert of
    advance jobs."""
    now = current_time(now)
    with transaction.atomic(using=alias()):
        ids, held = lock_batch(WorkflowRun, ids)
        failed = set(
            WorkflowRun.objects.filter(pk__in=ids, status=RunStatus.FAILED).values_list(
                "pk", flat=True
            )
        )
        # A failed child goes with its parent; a map's results may be too large to
        # resume: both are rare, and take the one-run path, which knows them.
        one_by_one = set(
            WorkflowStep.objects.filter(run_id__in=failed)
            .filter(
                Q(kind=StepKind.CHILD, status=StepStatus.FAILED, child__status=RunStatus.FAILED)
                | Q(kind=StepKind.MAP, status=StepStatus.RUNNING)
            )
            .values_list("run_id", flat=True)
        )
        resumed = 0
        for run_pk in sorted(one_by_one):
            try:
                with transaction.atomic(using=alias()):
                    resume_run(run_pk, now)
            except InvalidTransition:  # ResumeWouldFail, or no longer Failed
                continue
            resumed += 1
        # After them: a failed child of the batch resumed with its parent is Waiting.
        rest = WorkflowRun.objects.filter(pk__in=failed - one_by_one, status=RunStatus.FAILED)
        resumed += _resume_set(sorted(rest.values_list("pk", flat=True)), now)
    return BatchOutcome(changed={RESUMED: resumed}, held=held)


def _resume_set(run_pks: list[int], now: datetime) -> int:
    """Resume the Failed runs ``run_pks`` (locked; none with a failed child or an
    unfinished map), in the caller's transaction; how many."""
    if not run_pks:
        return 0
    erased = WorkflowStep.objects.filter(run_id__in=run_pks).filter(
        Q(status=StepStatus.FAILED) | Q(kind=StepKind.STEP, status=StepStatus.WAITING)
    )
    keys: dict[int, list[str]] = {pk: [] for pk in run_pks}
    for run_pk, key in erased.order_by("id").values_list("run_id", "key"):
        keys[run_pk].append(key)
    by_keys: dict[tuple[str, ...], list[int]] = {}
    for run_pk, run_keys in keys.items():
        by_keys.setdefault(tuple(run_keys), []).append(run_pk)
    resumed = 0
    for rerun_keys, pks in by_keys.items():
        resumed += WorkflowRun.objects.filter(pk__in=pks, status=RunStatus.FAILED).update(
            **_RESUMED, generation=F("generation") + 1, rerun_keys=list(rerun_keys), updated_at=now
        )
    erased.delete()
    woken = WorkflowRun.objects.filter(pk__in=run_pks).values_list("pk", "generation")
    wake_many(list(woken), "resume", now=now)
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
