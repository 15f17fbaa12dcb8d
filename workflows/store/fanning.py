"""The fan-in of a map: how its items stand, read with their jobs, and the wake of
its run once none is left.

An item that succeeds is recorded by its job alone: the item's handler returns the
result and the job's own finish statement writes it (``result_ref``, fenced by the
attempt's token like any finish). Its row stays Running until the run's fan-in reads
the items with their jobs (one statement) and copies how they ended onto their rows
(one more) in the transaction that records the checkpoint. So an item is, as it
stands: its row, once the row says it ended (a try that failed for good, a job
cancelled, the fan-in's copy); else its job, once the job ended; else Running.

The item jobs of a map are one jobs batch whose ``then`` job
(:data:`ITEMS_ENDED_HANDLER`) is inserted by the statement that ends the last of
them; it wakes the run (:func:`items_ended`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count, Exists, OuterRef, QuerySet, Subquery

from jobs.models import Job
from jobs.types import FINISHED_STATUSES, JobStatus
from ledon.errors import storable_text
from ledon.faults import fault_point

from ..exceptions import UntrustedJob
from ..models import WorkflowItem, WorkflowRun, WorkflowStep
from ..types import Checkpoint, Item, RunStatus, StepStatus
from .base import alias
from .waking import wake

#: The prefix of every item job's id: ``wf-item:{run}.{generation}:{nonce}:{index}``.
ITEM_JOB_PREFIX = "wf-item:"

#: The job handler of the ``then`` job of a map's item jobs (registered by
#: :mod:`workflows.handlers`): it wakes the run once every item job has ended.
ITEMS_ENDED_HANDLER = "workflows.items_ended"

#: The last part of the id of a batch's ``then`` job (the jobs' rule:
#: ``"<batch id>:then"``), the batch id being an item job id's prefix without its
#: last colon.
_THEN = "then"


def batch_prefix(job_id: str) -> str:
    """The start of the ids of the item jobs staged with the one of ``job_id`` (and of
    their batch's ``then`` job): ``wf-item:{run}.{generation}:{nonce}:``."""
    return job_id[: job_id.rfind(":") + 1]


def is_then_job(job_id: str) -> bool:
    """Whether ``job_id`` is the id of the ``then`` job of a map's item jobs."""
    return job_id.startswith(ITEM_JOB_PREFIX) and job_id == batch_prefix(job_id) + _THEN


def _item_job(scope_hash: Any = None) -> QuerySet[Job]:
    """The job of the outer item: of its run's scope (``scope_hash`` when it is known:
    an update names no joined column) and its id."""
    if scope_hash is None:
        scope_hash = OuterRef("step__run__scope_hash")
    return Job.objects.filter(scope_hash=scope_hash, job_id=OuterRef("job_id"))


def _recorded_by_job(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Of ``jobs``, those that recorded their item: Succeeded with a result (a job of
    an older version, or one whose result its item's row holds, has none)."""
    return jobs.filter(status=JobStatus.SUCCEEDED, result_ref__isnull=False)


def recorded_jobs(rows: QuerySet[WorkflowItem]) -> QuerySet[Job]:
    """The jobs that recorded items of ``rows`` (of one step) still Running on
    their rows: Succeeded, with their results."""
    running = rows.filter(status=StepStatus.RUNNING)
    return _recorded_by_job(Job.objects.all()).filter(
        scope_hash__in=running.values("step__run__scope_hash")[:1],
        job_id__in=running.values("job_id"),
    )


def left(rows: QuerySet[WorkflowItem]) -> QuerySet[WorkflowItem]:
    """Of ``rows``, the items not ended: Running on their row, their job not ended."""
    ended_job = _item_job().filter(status__in=FINISHED_STATUSES)
    return rows.filter(status=StepStatus.RUNNING).filter(~Exists(ended_job))


def items_left(step: Checkpoint) -> bool:
    """Whether an item of ``step`` has not ended (one index probe: the first item
    found Running with its job not ended answers)."""
    return left(WorkflowItem.objects.filter(step_id=step.pk)).exists()


def job_ending(job_status: str, job_error: str | None) -> tuple[StepStatus, str, str]:
    """How an item ended whose job ended ``job_status`` without the item recorded (a
    job cancelled, or ended outside the activity's code): its status, error type and
    error."""
    status = JobStatus(job_status)
    last_line = (job_error or "").strip().splitlines()[-1:] or [f"its job {status}"]
    text = f"its job ended {status.label} without recording it: {last_line[0]}"
    if status is JobStatus.CANCELLED:
        return StepStatus.CANCELLED, "Cancelled", text
    return StepStatus.FAILED, "ActivityJobEnded", text


#: The columns of an item, then of its job, that :func:`items_of` reads.
_ITEM_COLUMNS = (
    "id",
    "step_id",
    "index",
    "status",
    "attempts",
    "args_json",
    "result_json",
    "error_type",
    "error",
    "job_id",
)
_JOB_COLUMNS = ("status", "result_ref", "error", "attempt_count")


def items_of(step: Checkpoint, scope_hash: str) -> list[Item]:
    """The items of ``step`` (of a run of ``scope_hash``) in their order, each as it
    stands (see the module): one statement, the items joined with their jobs."""
    connection = transaction.get_connection(alias())
    q = connection.ops.quote_name
    item_columns = ", ".join(f"i.{q(name)}" for name in _ITEM_COLUMNS)
    job_columns = ", ".join(f"j.{q(name)}" for name in _JOB_COLUMNS)
    sql = (
        f"SELECT {item_columns}, {job_columns} FROM {q(WorkflowItem._meta.db_table)} i"
        f" LEFT JOIN {q(Job._meta.db_table)} j"
        f" ON j.{q('scope_hash')} = %s AND j.{q('job_id')} = i.{q('job_id')}"
        f" WHERE i.{q('step_id')} = %s ORDER BY i.{q('index')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [scope_hash, step.pk])
        rows = cursor.fetchall()
    return [_as_it_stands(row) for row in rows]


def _as_it_stands(row: Sequence[Any]) -> Item:
    values = dict(zip(_ITEM_COLUMNS, row[: len(_ITEM_COLUMNS)], strict=True))
    job_status, result_ref, job_error, job_attempts = row[len(_ITEM_COLUMNS) :]
    values["pk"] = values.pop("id")
    item = Item(**{**values, "status": StepStatus(values["status"])})
    # A first try read from its job's seal is counted by the job alone.
    attempts = max(item.attempts, job_attempts or 0)
    if item.status != StepStatus.RUNNING or job_status not in FINISHED_STATUSES:
        return replace(item, attempts=attempts)
    if job_status == JobStatus.SUCCEEDED and result_ref is not None:
        return replace(item, status=StepStatus.SUCCEEDED, result_json=result_ref, attempts=attempts)
    status, error_type, error = job_ending(job_status, job_error)
    return replace(item, status=status, error_type=error_type, error=error, attempts=attempts)


_NOT_SUCCEEDED = (StepStatus.FAILED, StepStatus.CANCELLED)


def record_items(step: Checkpoint, scope_hash: str, items: Sequence[Item], now: datetime) -> None:
    """Copy how the items of ``step`` ended (``items``, read by :func:`items_of`) onto
    the rows still Running, inside the caller's transaction: the items their jobs
    recorded in one statement, the few that ended otherwise one each."""
    running = WorkflowItem.objects.filter(step_id=step.pk, status=StepStatus.RUNNING)
    record_succeeded(running, scope_hash)
    unrecorded = {item.pk for item in items if item.status in _NOT_SUCCEEDED}
    if unrecorded:
        unrecorded &= set(running.values_list("pk", flat=True))
    for item in items:
        if item.pk in unrecorded:
            running.filter(pk=item.pk).update(
                status=item.status,
                error_type=item.error_type[:200],
                error=storable_text(item.error),
                attempts=item.attempts,
                finished_at=now,
            )


def record_succeeded(rows: QuerySet[WorkflowItem], scope_hash: str) -> int:
    """Of ``rows`` (items Running on their rows, of runs of ``scope_hash``), record
    those their jobs recorded, Succeeded with the jobs' results: one statement,
    inside the caller's transaction; how many."""
    job = _item_job(scope_hash)
    return rows.filter(Exists(_recorded_by_job(job))).update(
        status=StepStatus.SUCCEEDED,
        result_json=Subquery(job.values("result_ref")[:1]),
        attempts=Subquery(job.values("attempt_count")[:1]),
        finished_at=Subquery(job.values("finished_at")[:1]),
    )


def ended_by_jobs(step_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """Of the steps ``step_ids``, the items still Running on their rows whose jobs
    ended, counted by step and by how they ended (for the picture of a run)."""
    ended_job = _item_job().filter(status__in=FINISHED_STATUSES)
    rows = (
        WorkflowItem.objects.filter(step_id__in=step_ids, status=StepStatus.RUNNING)
        .annotate(
            job_status=Subquery(ended_job.values("status")[:1]),
            recorded=Exists(_recorded_by_job(ended_job)),
        )
        .filter(job_status__isnull=False)
        .values_list("step_id", "job_status", "recorded")
        .annotate(n=Count("id"))
        .order_by()
    )
    counted: dict[int, dict[str, int]] = {}
    for step_id, job_status, recorded, n in rows:
        status = StepStatus.SUCCEEDED if recorded else job_ending(job_status, None)[0]
        by_status = counted.setdefault(step_id, {})
        by_status[status] = by_status.get(status, 0) + n
    return counted


def fan_in(step_id: int, now: datetime) -> bool:
    """When every item of step ``step_id`` is queued and none is left (see
    :func:`left`), stage the advance that wakes its run. True if it did (or found it
    staged).

    The ``then`` job of the items' jobs calls this once they all ended, and so does
    every end written on an item's row (a failed try, a job ended outside its
    activity); several may see none left, and the wake's job id (the step's) makes
    one job of them."""
    if left(WorkflowItem.objects.filter(step_id=step_id)).exists():
        return False  # the common answer, one index probe, no transaction
    with transaction.atomic(using=alias()):
        step = WorkflowStep.objects.filter(pk=step_id).first()
        if step is None or queued(step.pk) < step.item_count:
            return False
        run = (
            WorkflowRun.objects.filter(pk=step.run_id, status__in=RunStatus.unfinished())
            .values_list("pk", "generation")
            .first()
        )
        if run is None:
            return False
        wake(run[0], run[1], "items", step.key, now=now)
    return True


def queued(step_pk: int) -> int:
    """How many items of step ``step_pk`` are queued (inserted) so far."""
    last = (
        WorkflowItem.objects.filter(step_id=step_pk)
        .order_by("-index")
        .values_list("index", flat=True)
        .first()
    )
    return 0 if last is None else last + 1


def then_job_step(scope_hash: str, job_id: str, payload: Any) -> int | None:
    """The step whose item jobs job ``job_id`` of scope ``scope_hash`` is the ``then``
    job of (it names the step; its id is their batch's ``then`` id; the step's run is
    of its scope), or None for any other job."""
    step_pk = payload.get("step") if isinstance(payload, dict) else None
    if not isinstance(step_pk, int) or isinstance(step_pk, bool) or not is_then_job(job_id):
        return None
    staged = WorkflowItem.objects.filter(
        step_id=step_pk,
        step__run__scope_hash=scope_hash,
        job_id__startswith=batch_prefix(job_id),
    )
    return step_pk if staged.exists() else None


def items_ended(scope_hash: str, job_id: str, payload: Any, now: datetime) -> bool:
    """The ``then`` job of a map's item jobs runs: every one of them ended, so the
    run is woken (:func:`fan_in`; True if it was). Only the job staged with the items
    does this: any other is :class:`UntrustedJob`, and nothing is written."""
    step_pk = then_job_step(scope_hash, job_id, payload)
    if step_pk is None:
        raise UntrustedJob(
            f"job {job_id!r} is not the job the workflow engine staged to follow a map's "
            "items: it wakes no run (the engine's own handlers run only the jobs it staged)"
        )
    fault_point("workflows.map.fan_in", step=step_pk)
    return fan_in(step_pk, now)
