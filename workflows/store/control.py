"""Control of a run from outside: cancel (with its children and items) and resume,
for a caller of a scope, the admin, and the advance job an operator cancelled.
:func:`cancel_run` and :func:`resume_run` act on one run by its row."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F, Q

from jobs import store as job_store
from jobs.models import Job
from jobs.types import JobStatus
from ledon.faults import fault_point

from ..exceptions import InvalidTransition, RunNotFound
from ..models import WorkflowItem, WorkflowRun, WorkflowStep
from ..types import CancelOutcome, RunSnapshot, RunStatus, StepKind, StepStatus, WaitKind
from .base import alias, current_time, ended, run_in_scope
from .bounds import refuse_hopeless_resume
from .deadlines import deadline_passed, stage_deadline, timed_out_error
from .fanning import batch_prefix, record_succeeded
from .reads import snapshot
from .waking import (
    ADVANCE_JOB_PREFIX,
    advance_job_prefix,
    advance_scope_hash,
    drop_wakes,
    wake,
    wake_parent,
)


def cancel(scope_hash: str, run_id: str, *, now: datetime | None = None) -> CancelOutcome:
    """A waiting run ends Cancelled at once; a running one is asked to stop (it ends
    Cancelled at its next checkpoint). Unfinished children and running activity items
    are cancelled with it."""
    now = current_time(now)
    with transaction.atomic(using=alias()):
        run = run_in_scope(scope_hash, run_id)
        return cancel_run(run.pk, now)


def cancel_run(run_pk: int, now: datetime, *, error: str = "") -> CancelOutcome:
    """Cancel run ``run_pk`` (see :func:`cancel`), inside the caller's transaction;
    ``error``: what a waiting run that ends at once keeps as its error (a deadline's
    ``RunTimedOut``)."""
    # Locked first: a run its driver suspends between the two guarded statements
    # below would otherwise match neither, and the cancel would be lost.
    run = (
        WorkflowRun.objects.select_for_update()
        .filter(pk=run_pk)
        .values_list("scope_hash", "parent_id", "parent_key")
        .first()
    )
    if run is None:
        return CancelOutcome.ALREADY_FINISHED  # purged meanwhile
    scope_hash, parent_pk, parent_key = run
    cancelled = WorkflowRun.objects.filter(pk=run_pk, status=RunStatus.WAITING).update(
        **ended(RunStatus.CANCELLED, now), cancel_requested=True, error=error
    )
    if cancelled:
        cancel_dependents(run_pk, scope_hash, now)
        drop_wakes([run_pk], now)
        wake_parent(parent_pk, parent_key, now)
        return CancelOutcome.CANCELLED
    fault_point("workflows.cancel.not_waiting", run=run_pk)
    asked = WorkflowRun.objects.filter(pk=run_pk, status=RunStatus.RUNNING).update(
        cancel_requested=True, updated_at=now
    )
    if asked:
        cancel_dependents(run_pk, scope_hash, now)
        return CancelOutcome.REQUESTED
    return CancelOutcome.ALREADY_FINISHED


def cancel_dependents(run_pk: int, scope_hash: str, now: datetime) -> None:
    """Cancel run ``run_pk``'s unfinished children and its items' jobs, and mark its
    open checkpoints Cancelled (see :func:`cancel_dependents_of`)."""
    cancel_dependents_of([run_pk], now)


def cancel_dependents_of(run_pks: Sequence[int], now: datetime) -> None:
    """Cancel the unfinished children of the runs ``run_pks`` and their items' jobs,
    and mark their open checkpoints Cancelled: a few statements however many runs.

    The items' jobs go by their batches' id prefixes (an item's job id names its
    run, its generation and a random part per map, so a prefix names exactly the
    jobs staged with that map, and its ``then`` job): Queued ones end Cancelled and
    Running ones are asked to stop, one statement each per scope however large the
    maps. The items their jobs recorded before the cancel keep their results
    (copied onto their rows, one statement per scope)."""
    children = WorkflowRun.objects.filter(parent_id__in=run_pks, status__in=RunStatus.unfinished())
    for child_pk in children.values_list("pk", flat=True):
        cancel_run(child_pk, now)
    running = WorkflowItem.objects.filter(step__run_id__in=run_pks, status=StepStatus.RUNNING)
    batches: dict[str, set[str]] = {}
    for scope_hash, job_id in running.values_list("step__run__scope_hash", "job_id"):
        batches.setdefault(scope_hash, set()).add(batch_prefix(job_id))
    for scope_hash, prefixes in batches.items():
        # Twice: the statement that cancels a map's last queued item jobs queues
        # their batch's ``then`` job (it ends the batch), which has nothing to wake.
        job_store.cancel_queued(scope_hash, sorted(prefixes), now=now)
        job_store.cancel_queued(scope_hash, sorted(prefixes), now=now)
        job_store.cancel_running(scope_hash, sorted(prefixes), now=now)
        record_succeeded(running.filter(step__run__scope_hash=scope_hash), scope_hash, now)
    running.update(status=StepStatus.CANCELLED, finished_at=now)
    WorkflowStep.objects.filter(
        run_id__in=run_pks, status__in=(StepStatus.RUNNING, StepStatus.WAITING)
    ).update(status=StepStatus.CANCELLED, finished_at=now)


def time_out(run_pk: int, now: datetime) -> CancelOutcome | None:
    """Run ``run_pk``'s deadline passed: a Waiting run ends Cancelled at once, with the
    ``RunTimedOut`` error; a Running one is asked to stop, and its driver ends it so
    at its next checkpoint. Its unfinished children and activity jobs are cancelled
    with it (see :func:`~workflows.store.cancel_run`). None (nothing written) if it
    has no deadline, or it has not passed."""
    with transaction.atomic(using=alias()):
        row = WorkflowRun.objects.filter(pk=run_pk).values_list("run_id", "deadline").first()
        if row is None or row[1] is None or not deadline_passed(row[1], now):
            return None
        return cancel_run(run_pk, now, error=timed_out_error(row[0], row[1]))


#: The checkpoints a resume erases: a failed try of an inline step, a failed map or
#: activity, a timed-out wait (the replay records them again).
ERASED_ON_RESUME = Q(status=StepStatus.FAILED) | Q(kind=StepKind.STEP, status=StepStatus.WAITING)


def resumed_fields(now: datetime) -> dict[str, Any]:
    """What a resume sets on a Failed run: waiting to be replayed, one generation on,
    its failure forgotten."""
    return {
        "status": RunStatus.WAITING,
        "generation": F("generation") + 1,
        "cancel_requested": False,
        "error": "",
        "failed_step": "",
        "output_json": None,
        "wait_kind": WaitKind.RESUME,
        "wait_key": "",
        "finished_at": None,
        "updated_at": now,
    }


def resume(scope_hash: str, run_id: str, *, now: datetime | None = None) -> RunSnapshot:
    """FAILED -> WAITING: the failed checkpoints are erased (a failed child run is
    resumed too), so the replay runs them again with fresh retries; recorded
    checkpoints keep their values."""
    now = current_time(now)
    with transaction.atomic(using=alias()):
        run = run_in_scope(scope_hash, run_id)
        resume_run(run.pk, now)
        return snapshot(WorkflowRun.objects.select_related("parent").get(pk=run.pk))


def resume_run(run_pk: int, now: datetime) -> None:
    """Resume run ``run_pk`` (see :func:`resume`), inside the caller's transaction:
    :class:`~workflows.exceptions.ResumeWouldFail` if it would fail again the same
    way, :class:`~workflows.exceptions.InvalidTransition` if it is not Failed."""
    run = (
        WorkflowRun.objects.select_for_update()
        .filter(pk=run_pk)
        .values_list("run_id", "status")
        .first()
    )
    if run is None:
        raise RunNotFound(f"no run {run_pk}")
    run_id, status = run
    if status == RunStatus.FAILED:
        refuse_hopeless_resume(run_pk, run_id)
    _resume(run_pk, run_id, status, now)


def _resume(run_pk: int, run_id: str, status: str, now: datetime) -> None:
    resumed = WorkflowRun.objects.filter(pk=run_pk, status=RunStatus.FAILED).update(
        **resumed_fields(now)
    )
    if not resumed:
        raise InvalidTransition(f"run {run_id!r} is {status}: only a Failed run resumes")
    failed = WorkflowStep.objects.filter(run_id=run_pk, status=StepStatus.FAILED)
    failed_children = failed.filter(kind=StepKind.CHILD, child__status=RunStatus.FAILED)
    for step_pk, child_pk, child_id in failed_children.values_list(
        "pk", "child_id", "child__run_id"
    ):
        _resume(child_pk, child_id, RunStatus.FAILED, now)
        WorkflowStep.objects.filter(pk=step_pk, status=StepStatus.FAILED).update(
            status=StepStatus.WAITING, finished_at=None
        )
    # A failed try of an inline step, a failed map or activity, a timed-out wait: the
    # replay records them again. (Non-child failed steps only: a resumed child keeps
    # its checkpoint, now waiting.) Their keys are kept, so that the replay records
    # them again where they stood (see ``WorkflowRun.rerun_keys``).
    erased = WorkflowStep.objects.filter(run_id=run_pk).filter(ERASED_ON_RESUME)
    rerun_keys = list(erased.order_by("id").values_list("key", flat=True))
    erased.delete()
    WorkflowRun.objects.filter(pk=run_pk).update(rerun_keys=rerun_keys)
    generation, deadline = WorkflowRun.objects.filter(pk=run_pk).values_list(
        "generation", "deadline"
    )[0]
    wake(run_pk, generation, "resume", now=now)
    # The run's deadline still holds: its wake-up was dropped when the run failed.
    stage_deadline(run_pk, generation, deadline, now)


def advance_job_cancelled(scope_hash: str, job_id: str, now: datetime) -> CancelOutcome | None:
    """An advance job of a run was cancelled (an operator cancelled it in the jobs
    admin, queued or before its handler ran). A run that the job held is let go
    (Waiting). If no other advance job of the run is queued or running, nothing would
    ever advance it again: the run is cancelled with its job. None if ``job_id`` is no
    advance job of a run (any other job: no query), or if the run has another
    advance job and goes on."""
    if scope_hash != advance_scope_hash() or not job_id.startswith(ADVANCE_JOB_PREFIX):
        return None
    run_pk = job_id.removeprefix(ADVANCE_JOB_PREFIX).split(".", 1)[0]
    if not run_pk.isdigit():
        return None
    with transaction.atomic(using=alias()):
        run = WorkflowRun.objects.filter(pk=int(run_pk)).first()
        if run is None:
            return None
        WorkflowRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING, driver_job=job_id).update(
            status=RunStatus.WAITING, driver_token=None, driver_job=None, updated_at=now
        )
        others = (
            Job.objects.filter(
                scope_hash=scope_hash,
                job_id__startswith=advance_job_prefix(run.pk),
                status__in=(JobStatus.QUEUED, JobStatus.RUNNING),
            )
            .exclude(job_id=job_id)
            .exists()
        )
        if others:
            return None
        return cancel_run(run.pk, now)
