"""Activity items and fan-in: a map's items and their jobs queued in batches, each
try counted and each end recorded on the item's own row, and the run woken once
none is left running; items whose job ended without recording them are ended."""

from __future__ import annotations

import secrets
from dataclasses import fields as fields_of
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet, Subquery

from jobs import store as job_store
from jobs.models import Job
from jobs.types import FINISHED_STATUSES, JobStatus, JobSubmission
from ledon.errors import storable_text
from ledon.faults import fault_point
from ledon.values import from_row

from ..exceptions import UntrustedJob
from ..models import WorkflowItem, WorkflowRun, WorkflowStep
from ..types import Checkpoint, DrivenRun, Item, RunStatus, StepStatus
from .base import alias
from .waking import wake

#: Items (with their jobs) queued per transaction: a large map is queued in
#: batches, each its own fenced transaction, so that no write lock is held long.
ITEM_BATCH = 500


#: The prefix of every item job's id (see :func:`insert_items`).
ITEM_JOB_PREFIX = "wf-item:"


def batch_prefix(job_id: str) -> str:
    """The start of the ids of the item jobs staged with the one of ``job_id``:
    ``wf-item:{run}.{generation}:{nonce}:`` (all but the item's index)."""
    return job_id[: job_id.rindex(":") + 1]


def insert_items(
    run: DrivenRun, step: Checkpoint, activity: Any, args: list[str], *, start: int = 0
) -> None:
    """Items ``start`` … ``start + len(args) - 1`` of an activity or map step and one
    job per item, each inserted in bulk (inside a fenced transaction; the caller
    queues at most :data:`ITEM_BATCH` at a time), in the run's scope so per-scope
    limits apply to them.

    An item's job runs it only if the job is the one staged here (its scope and id,
    see :func:`start_item`); the id holds a random part, so no one can take it
    before it is staged. The activity's retries are the job's: ``retries + 1``
    attempts, the activity's back-off between them (its handler's policy).
    """
    nonce = secrets.token_hex(10)
    items = [
        WorkflowItem(
            step_id=step.pk,
            index=index,
            status=StepStatus.RUNNING,
            args_json=args_json,
            job_id=f"{ITEM_JOB_PREFIX}{run.pk}.{run.generation}:{nonce}:{index}",
        )
        for index, args_json in enumerate(args, start)
    ]
    WorkflowItem.objects.bulk_create(items)
    if any(item.pk is None for item in items):  # a database that returns no ids
        ids = dict(
            WorkflowItem.objects.filter(
                step_id=step.pk, index__gte=start, index__lt=start + len(items)
            ).values_list("index", "pk")
        )
        for item in items:
            item.pk = ids[item.index]
    job_store.stage_many(
        [
            (
                run.scope_hash,
                item.job_id,
                JobSubmission.create(
                    activity.name,
                    {"item": item.pk},
                    queue=activity.queue,
                    max_attempts=activity.retries + 1,
                ),
            )
            for item in items
        ]
    )


def items_queued(step: Checkpoint) -> int:
    """How many items of ``step`` are queued (inserted) so far: a driver stopped
    while it queued a large map's batches left fewer than ``item_count``."""
    return _queued(step.pk)


def _queued(step_pk: int) -> int:
    last = (
        WorkflowItem.objects.filter(step_id=step_pk)
        .order_by("-index")
        .values_list("index", flat=True)
        .first()
    )
    return 0 if last is None else last + 1


#: What an item's try reads back from the statement that counts it: an :class:`Item`.
_ITEM_STARTED = tuple("id" if field.name == "pk" else field.name for field in fields_of(Item))


def staged_items(scope_hash: str, job_id: str) -> QuerySet[WorkflowItem]:
    """The items job ``job_id`` of scope ``scope_hash`` was staged for: the item
    names its job, and its run is of that scope."""
    return WorkflowItem.objects.filter(job_id=job_id, step__run__scope_hash=scope_hash)


def start_item(item_pk: int, scope_hash: str, job_id: str, now: datetime) -> Item:
    """Count a try of item ``item_pk`` by its job (``scope_hash``, ``job_id``) and
    return the item, Running; or, if it ended already, the item as it ended, nothing
    counted (a job replayed after its item was recorded: its worker may have been
    killed after the item's end committed and before the fan-in check, so the check
    is made again here).

    Only the job staged for the item counts a try (the item names its job, and its
    run is of the job's scope): any other job is :class:`UntrustedJob`, and nothing
    is written. One guarded ``UPDATE … RETURNING``, its own transaction: every item
    of a map pays for it, so it is one round trip (only this item's job writes the
    row while it runs).
    """
    connection = transaction.get_connection(alias())
    ops = connection.ops
    q = ops.quote_name
    item_table = q(WorkflowItem._meta.db_table)
    step_table = q(WorkflowStep._meta.db_table)
    run_table = q(WorkflowRun._meta.db_table)
    columns = ", ".join(q(name) for name in _ITEM_STARTED)
    sql = (
        f"UPDATE {item_table} SET {q('attempts')} = {q('attempts')} + 1,"
        f" {q('started_at')} = %s"
        f" WHERE {q('id')} = %s AND {q('status')} = %s AND {q('job_id')} = %s"
        f" AND EXISTS (SELECT 1 FROM {step_table} s INNER JOIN {run_table} r"
        f" ON r.{q('id')} = s.{q('run_id')}"
        f" WHERE s.{q('id')} = {item_table}.{q('step_id')} AND r.{q('scope_hash')} = %s)"
        f" RETURNING {columns}"
    )
    params = [ops.adapt_datetimefield_value(now), item_pk, StepStatus.RUNNING, job_id, scope_hash]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is not None:
        started = dict(zip(_ITEM_STARTED, row, strict=True))
        started["pk"] = started.pop("id")
        started["status"] = StepStatus(started["status"])
        return Item(**started)
    ended = staged_items(scope_hash, job_id).filter(pk=item_pk).first()
    if ended is None:
        raise UntrustedJob(
            f"job {job_id!r} was not staged for workflow item {item_pk}: it runs nothing "
            "(the engine's own handlers run only the jobs it staged)"
        )
    fan_in(ended.step_id, now)
    return item_of(ended)


def item_of(row: WorkflowItem) -> Item:
    """The item ``row`` as its value."""
    return from_row(Item, row, pk=row.pk, status=StepStatus(row.status))


def end_item(
    item: Item,
    status: StepStatus,
    now: datetime,
    *,
    result_json: str | None = None,
    error_type: str = "",
    error: str = "",
    token: str | None = None,
) -> bool:
    """Record an item's end (a guarded update of the item's own row, so items of one
    map never wait on each other's locks), then :func:`fan_in`. False if the item
    had ended already (nothing written; the check is made again all the same).

    ``token``: the item job's attempt that ran this try. Its end is written only
    while that attempt is still the job's current one: a try that ran past its
    timeout, or whose lease another worker recovered, is fenced off like any late
    finish, and the try that took over records the item."""
    fault_point("workflows.map.fan_in", item=item.pk)
    still_running = WorkflowItem.objects.filter(pk=item.pk, status=StepStatus.RUNNING)
    if token is not None:
        still_running = still_running.filter(
            Exists(Job.objects.filter(current_token=token, status=JobStatus.RUNNING))
        )
    # One guarded statement, its own transaction (one round trip, one commit).
    ended = still_running.update(
        status=status,
        result_json=result_json,
        error_type=error_type[:200],
        error=storable_text(error),
        finished_at=now,
    )
    if ended:
        fault_point("workflows.map.item_ended", item=item.pk)
    fan_in(item.step_id, now)
    return bool(ended)


def fan_in(step_id: int, now: datetime) -> bool:
    """After an item's end has committed: when every item of step ``step_id`` is
    queued and none is left running, stage the advance that wakes its run. True if
    it did (or found it staged).

    Every item makes this check after its own commit, so the last of several items
    that end at once sees them all ended; several may see it, and the wake's job id
    (the step's) makes one job of them. An item job replayed after its item ended
    (its worker killed between that commit and this check) makes it again, so no
    wake-up is lost. While a large map's batches are still being queued, the items
    of the first ones may all end: the run is not woken for them.
    """
    if WorkflowItem.objects.filter(step_id=step_id, status=StepStatus.RUNNING).exists():
        return False  # the common answer, one index probe, no transaction
    with transaction.atomic(using=alias()):
        step = WorkflowStep.objects.filter(pk=step_id).first()
        if step is None or _queued(step.pk) < step.item_count:
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


def items_left(step: Checkpoint) -> int:
    """How many items of ``step`` have not ended."""
    return WorkflowItem.objects.filter(step_id=step.pk, status=StepStatus.RUNNING).count()


def record_item_error(item: Item, error_type: str, error: str) -> None:
    """Keep a failed try's error on an item that will be tried again."""
    WorkflowItem.objects.filter(pk=item.pk, status=StepStatus.RUNNING).update(
        error_type=error_type[:200], error=storable_text(error)
    )


def items_of(step: Checkpoint) -> list[Item]:
    """The items of ``step``, in their order."""
    return [item_of(row) for row in WorkflowItem.objects.filter(step_id=step.pk).order_by("index")]


def item_job_ended(
    scope_hash: str,
    job_id: str,
    item_pk: int,
    now: datetime,
    *,
    error_type: str = "ActivityJobFailed",
    error: str = "its job failed",
) -> bool:
    """An item's job ended for good outside the activity's own code (no worker knew
    the activity, its last try ran past its timeout, its worker kept dying): record
    the item Failed so its step can end. Only the job staged for the item (its scope
    and id) ends it. False if the item had ended, or is not that job's."""
    staged = staged_items(scope_hash, job_id).filter(pk=item_pk)
    item = staged.filter(status=StepStatus.RUNNING).first()
    if item is None:
        step_id = staged.values_list("step_id", flat=True).first()
        if step_id is not None:
            fan_in(step_id, now)  # its end may have committed just before a kill
        return False
    return end_item(item_of(item), StepStatus.FAILED, now, error_type=error_type, error=error)


def end_items_of_ended_jobs(
    now: datetime, *, limit: int = ITEM_BATCH, job: tuple[str, str] | None = None
) -> int:
    """End up to ``limit`` items still Running whose job has ended for good without
    recording them, and return how many: the job ended Interrupted after its
    worker kept dying, or its worker was killed between the job's end and the
    signal that ends the item. Their steps end, their runs are woken. ``job``
    (scope hash, job id): only the item that job was staged for (the word of its
    end came: see :mod:`workflows.receivers`)."""
    ended_job = Job.objects.filter(
        scope_hash=OuterRef("step__run__scope_hash"),
        job_id=OuterRef("job_id"),
        status__in=FINISHED_STATUSES,
    )
    running = WorkflowItem.objects.filter(status=StepStatus.RUNNING)
    if job is not None:
        running = running & staged_items(*job)
    items = (
        running.annotate(
            job_status=Subquery(ended_job.values("status")[:1]),
            job_error=Subquery(ended_job.values("error")[:1]),
        )
        .filter(job_status__isnull=False)
        .order_by("pk")[:limit]
    )
    ended = 0
    for item in items:
        status = JobStatus(item.job_status)
        last_line = (item.job_error or "").strip().splitlines()[-1:] or [f"its job {status}"]
        if status is JobStatus.CANCELLED:
            outcome, error_type = StepStatus.CANCELLED, "Cancelled"
        else:
            outcome, error_type = StepStatus.FAILED, "ActivityJobEnded"
        text = f"its job ended {status.label} without recording it: {last_line[0]}"
        ended += end_item(item_of(item), outcome, now, error_type=error_type, error=text)
    return ended


def item_job_cancelled(scope_hash: str, job_id: str, now: datetime) -> bool:
    """An item's job was cancelled before its handler recorded the item (its scope's
    caller or the admin cancelled it while Queued, or while it waited in a worker's
    look-ahead): record the item Cancelled so its step can end. False if ``job_id``
    names no running item of that scope (any other job: no query)."""
    if not job_id.startswith(ITEM_JOB_PREFIX):
        return False
    run_pk = job_id.removeprefix(ITEM_JOB_PREFIX).split(".", 1)[0]
    if not run_pk.isdigit():
        return False
    item = WorkflowItem.objects.filter(
        step__run_id=int(run_pk),
        step__run__scope_hash=scope_hash,
        job_id=job_id,
        status=StepStatus.RUNNING,
    ).first()
    if item is None:
        return False
    return end_item(
        item_of(item),
        StepStatus.CANCELLED,
        now,
        error_type="Cancelled",
        error="its job was cancelled",
    )
