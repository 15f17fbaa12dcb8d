"""The fan-in of a map: how its items stand, read with their jobs, and the wake of
its run once none is left.

An item that succeeds is recorded by its job alone: the item's handler returns the
result and the job's own finish statement writes it (``result_ref``, fenced by the
attempt's token like any finish). Its row stays Running until the run's fan-in reads
the items' rows, then their jobs as one set through their batch (never item by
item), and marks how they ended on the rows in the transaction that records the
checkpoint. So an item is, as it stands: its row, once the row says it ended (a try
that failed for good, a job cancelled, the fan-in's mark); else its job, once the
job ended; else Running.

The item jobs of a map are one jobs batch whose ``then`` job is the run's own
advance job (:func:`~workflows.store.items.items_wake`), inserted by the statement
that ends the last of them: it takes the run and gathers the items, with no job
between. A map staged by an older version has a ``then`` job of its own
(:data:`ITEMS_ENDED_HANDLER`, in the run's scope), which wakes the run
(:func:`items_ended`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, F, Q, QuerySet, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Greatest

from jobs.models import Batch, Job
from jobs.types import FINISHED_STATUSES, JobStatus
from ledon.errors import storable_text
from ledon.faults import fault_point
from ledon.values import from_row

from ..exceptions import UntrustedJob
from ..models import WorkflowItem, WorkflowRun, WorkflowStep
from ..types import Checkpoint, Item, RunStatus, StepStatus, WaitKind
from .base import alias
from .waking import ADVANCE_JOB_PREFIX, wake

#: The prefix of every item job's id: ``wf-item:{run}.{generation}:{nonce}:{index}``.
ITEM_JOB_PREFIX = "wf-item:"

#: The job handler of the ``then`` job of a map's item jobs as an older version
#: staged it (registered by :mod:`workflows.handlers`): it wakes the run once every
#: item job has ended. A map's ``then`` job is now the run's advance.
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


def _batch_ids(rows: QuerySet[WorkflowItem]) -> list[str]:
    """The jobs batches of the items of ``rows`` still Running on their rows (their
    job ids' prefixes without the last colon: see :func:`batch_prefix`)."""
    job_ids = rows.filter(status=StepStatus.RUNNING).values_list("job_id", flat=True)
    return sorted({batch_prefix(job_id)[:-1] for job_id in job_ids})


def _batch_jobs(scope_hash: str, batch_ids: Sequence[str]) -> QuerySet[Job]:
    """The item jobs of the batches ``batch_ids`` of scope ``scope_hash``: read
    through the batches' index, as one set, never looked up item by item (so a read
    never depends on the planner's guess at the jobs table's size)."""
    return Job.objects.filter(scope_hash=scope_hash, batch_id__in=batch_ids).order_by()


def _recorded(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Of ``jobs``, those that recorded their item: Succeeded with a result."""
    return jobs.filter(status=JobStatus.SUCCEEDED, result_ref__isnull=False)


def recorded_jobs(rows: QuerySet[WorkflowItem], scope_hash: str) -> QuerySet[Job]:
    """The jobs that recorded items of ``rows`` (of runs of ``scope_hash``) still
    Running on their rows: Succeeded, with their results."""
    running = rows.filter(status=StepStatus.RUNNING)
    jobs = _recorded(_batch_jobs(scope_hash, _batch_ids(rows)))
    return jobs.filter(job_id__in=running.values("job_id"))


def left(rows: QuerySet[WorkflowItem], scope_hash: str) -> QuerySet[WorkflowItem]:
    """Of ``rows`` (items of runs of ``scope_hash``), the items not ended: Running on
    their row, their job not ended (an item staged by an older version, its job in
    no batch, ends on its row only)."""
    ended = _batch_jobs(scope_hash, _batch_ids(rows)).filter(status__in=FINISHED_STATUSES)
    return rows.filter(status=StepStatus.RUNNING).exclude(job_id__in=ended.values("job_id"))


def items_left(step: Checkpoint, scope_hash: str) -> bool:
    """Whether an item of ``step`` (of a run of ``scope_hash``) has not ended: while
    its item jobs are one jobs batch (as :func:`~workflows.store.insert_items` queues
    them), the batch's count of jobs not ended says it, one row read; else (a map of
    several batches) the items are read."""
    return _any_left(step.pk, step.item_count, scope_hash)


def _any_left(step_pk: int, item_count: int, scope_hash: str) -> bool:
    rows = WorkflowItem.objects.filter(step_id=step_pk)
    first = rows.order_by("index").values_list("job_id", flat=True).first()
    if first is None:
        return False
    batch = (
        Batch.objects.filter(scope_hash=scope_hash, batch_id=batch_prefix(first)[:-1])
        .values_list("pending", "total")
        .first()
    )
    if batch is not None and batch[1] == item_count:
        # Every job of the batch ended: every item did (on its row, or by its job).
        # Else at least one item is left unless every row says how it ended.
        return batch[0] > 0 and rows.filter(status=StepStatus.RUNNING).exists()
    return left(rows, scope_hash).exists()


def job_tries() -> CombinedExpression:
    """The tries an item's job made: its counted attempts and those its worker died
    in (recovered, uncounted: the crash budget's), each of which ran the activity."""
    return F("attempt_count") + F("interruption_count")


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


#: What :func:`items_of` reads of an item's row: an :class:`Item`'s fields.
_ITEM_FIELDS = tuple(field.name for field in fields(Item))
_STATUS_AT, _JOB_ID_AT = _ITEM_FIELDS.index("status"), _ITEM_FIELDS.index("job_id")
#: What :func:`items_of` reads of an item's job.
_JOB_COLUMNS = ("job_id", "status", "result_ref", "error", "tries")


def items_of(step: Checkpoint, scope_hash: str) -> list[Item]:
    """The items of ``step`` (of a run of ``scope_hash``) in their order, each as it
    stands (see the module): their rows, then their jobs in one statement; each item
    built once, as it stands."""
    rows = list(
        WorkflowItem.objects.filter(step_id=step.pk).order_by("index").values_list(*_ITEM_FIELDS)
    )
    running = {row[_JOB_ID_AT] for row in rows if row[_STATUS_AT] == StepStatus.RUNNING}
    jobs: dict[str, tuple[Any, ...]] = {}
    if running:
        batch_ids = sorted({batch_prefix(job_id)[:-1] for job_id in running})
        jobs = {
            row[0]: row[1:]
            for row in _batch_jobs(scope_hash, batch_ids)
            .filter(status__in=FINISHED_STATUSES)
            .annotate(tries=job_tries())
            .values_list(*_JOB_COLUMNS)
        }
    return [_as_it_stands(row, jobs.get(row[_JOB_ID_AT])) for row in rows]


def item_of(row: WorkflowItem) -> Item:
    """The item ``row`` as its value."""
    return from_row(Item, row, pk=row.pk, status=StepStatus(row.status))


def _as_it_stands(row: tuple[Any, ...], job: tuple[Any, ...] | None) -> Item:
    """The item of ``row`` (its :data:`_ITEM_FIELDS`) as it stands, its job ended as
    ``job`` (status, result, error, attempts; None: not ended, or in no batch)."""
    item = dict(zip(_ITEM_FIELDS, row, strict=True))
    status = StepStatus(item["status"])
    if status == StepStatus.RUNNING and job is not None:
        job_status, result_ref, job_error, job_attempts = job
        # A first try read from its job's seal is counted by the job alone.
        item["attempts"] = max(item["attempts"], job_attempts)
        if job_status == JobStatus.SUCCEEDED and result_ref is not None:
            status, item["result_json"] = StepStatus.SUCCEEDED, result_ref
        else:
            status, item["error_type"], item["error"] = job_ending(job_status, job_error)
    item["status"] = status
    return Item(**item)


_NOT_SUCCEEDED = (StepStatus.FAILED, StepStatus.CANCELLED)


def record_items(step: Checkpoint, items: Sequence[Item], now: datetime) -> None:
    """Copy how the items of ``step`` ended (``items``, every one ended, read by
    :func:`items_of`) onto the rows still Running, inside the caller's transaction:
    the few that did not succeed one each, then the others in one statement per
    number of tries (nearly always one: their results stay in their jobs and in the
    checkpoint's list, their tries are copied from their jobs)."""
    running = WorkflowItem.objects.filter(step_id=step.pk, status=StepStatus.RUNNING)
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
    by_tries: dict[int, list[int]] = {}
    for item in items:
        if item.pk not in unrecorded and item.status == StepStatus.SUCCEEDED:
            by_tries.setdefault(item.attempts, []).append(item.pk)
    # The few with an unusual number of tries by their ids, then the rest at once.
    *fewer, most = sorted(by_tries.items(), key=lambda group: len(group[1])) or [(0, [])]
    for attempts, pks in fewer:
        running.filter(pk__in=pks).update(
            status=StepStatus.SUCCEEDED, attempts=attempts, finished_at=now
        )
    running.update(
        status=StepStatus.SUCCEEDED, attempts=Greatest("attempts", Value(most[0])), finished_at=now
    )


def record_succeeded(rows: QuerySet[WorkflowItem], scope_hash: str, now: datetime) -> int:
    """Of ``rows`` (items Running on their rows, of runs of ``scope_hash``), mark
    Succeeded those their jobs recorded: one statement, inside the caller's
    transaction; how many."""
    recorded = _recorded(_batch_jobs(scope_hash, _batch_ids(rows)))
    return rows.filter(status=StepStatus.RUNNING, job_id__in=recorded.values("job_id")).update(
        status=StepStatus.SUCCEEDED, finished_at=now
    )


#: A jobs batch's counts, as :func:`batch_counts` reads them.
_BATCH_COUNTS = ("pending", "succeeded", "failed", "cancelled", "expired")


def batch_counts(steps: Sequence[tuple[int, str, int]]) -> dict[int, dict[str, int]]:
    """The items of the open ``steps`` (step, its run's scope, its item count)
    counted by how they stand, from their jobs batch's counts (one row each), for
    the steps whose item jobs are one batch (as :func:`~workflows.store.insert_items`
    queues them); the others are left out."""
    first = dict(
        WorkflowItem.objects.filter(step_id__in=[pk for pk, _, _ in steps], index=0).values_list(
            "step_id", "job_id"
        )
    )
    wanted: dict[tuple[str, str], tuple[int, int]] = {}
    for step_pk, scope_hash, item_count in steps:
        if step_pk in first:
            wanted[(scope_hash, batch_prefix(first[step_pk])[:-1])] = (step_pk, item_count)
    counted: dict[int, dict[str, int]] = {}
    for scope_hash in {scope for scope, _ in wanted}:
        batch_ids = [batch_id for scope, batch_id in wanted if scope == scope_hash]
        for batch_id, total, pending, succeeded, failed, cancelled, expired in Batch.objects.filter(
            scope_hash=scope_hash, batch_id__in=batch_ids
        ).values_list(
            "batch_id", "total", "pending", "succeeded", "failed", "cancelled", "expired"
        ):
            step_pk, item_count = wanted[(scope_hash, batch_id)]
            if total == item_count:
                counted[step_pk] = {
                    StepStatus.RUNNING: pending,
                    StepStatus.SUCCEEDED: succeeded,
                    StepStatus.FAILED: failed + expired,
                    StepStatus.CANCELLED: cancelled,
                }
    return counted


def ended_by_jobs(step_ids: Sequence[int], scope_hash: str) -> dict[int, dict[str, int]]:
    """Of the steps ``step_ids`` (of runs of ``scope_hash``), the items still Running
    on their rows whose jobs ended, counted by step and by how they ended (for the
    picture of a run): their rows, then their jobs in one statement."""
    rows = WorkflowItem.objects.filter(step_id__in=step_ids, status=StepStatus.RUNNING)
    running = dict(rows.values_list("job_id", "step_id"))
    if not running:
        return {}
    batch_ids = sorted({batch_prefix(job_id)[:-1] for job_id in running})
    ended = (
        _batch_jobs(scope_hash, batch_ids)
        .filter(status__in=FINISHED_STATUSES)
        .annotate(has_result=ExpressionWrapper(Q(result_ref__isnull=False), BooleanField()))
        .values_list("job_id", "status", "has_result")
    )
    counted: dict[int, dict[str, int]] = {}
    for job_id, job_status, has_result in ended:
        step_id = running.get(job_id)
        if step_id is None:
            continue
        recorded = job_status == JobStatus.SUCCEEDED and has_result
        status = StepStatus.SUCCEEDED if recorded else job_ending(job_status, None)[0]
        by_status = counted.setdefault(step_id, {})
        by_status[status] = by_status.get(status, 0) + 1
    return counted


def fan_in(step_id: int, now: datetime) -> bool:
    """When every item of step ``step_id`` is queued and none is left (see
    :func:`left`), stage the advance that wakes its run. True if it did (or found it
    staged).

    The ``then`` job of the items' jobs calls this once they all ended, and so does
    every end written on an item's row (a failed try, a job ended outside its
    activity); several may see none left, and the wake's job id (the step's) makes
    one job of them."""
    found = (
        WorkflowStep.objects.filter(pk=step_id).values_list("item_count", "run__scope_hash").first()
    )
    if found is None or _any_left(step_id, *found):
        return False  # the common answer for all but the last, no transaction
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
    staged = _then_job_map(scope_hash, job_id, payload)
    return None if staged is None else staged.step_pk


@dataclass(frozen=True, slots=True)
class _ThenJobMap:
    """The map a ``then`` job follows, as it reads it: its step, and the step's run."""

    step_pk: int
    step_key: str
    item_count: int
    run_pk: int
    generation: int
    run_status: str


def _then_job_map(scope_hash: str, job_id: str, payload: Any) -> _ThenJobMap | None:
    """:func:`then_job_step`'s map with its run, in one statement (None: any other
    job)."""
    step_pk = payload.get("step") if isinstance(payload, dict) else None
    if not isinstance(step_pk, int) or isinstance(step_pk, bool) or not is_then_job(job_id):
        return None
    found = (
        WorkflowItem.objects.filter(
            step_id=step_pk,
            step__run__scope_hash=scope_hash,
            job_id__startswith=batch_prefix(job_id),
        )
        .values_list(
            "step__key",
            "step__item_count",
            "step__run_id",
            "step__run__generation",
            "step__run__status",
        )
        .first()
    )
    if found is None:
        return None
    key, item_count, run_pk, generation, run_status = found
    return _ThenJobMap(step_pk, key, item_count, int(run_pk), generation, run_status)


def items_ended(scope_hash: str, job_id: str, payload: Any, now: datetime) -> bool:
    """The ``then`` job of a map's item jobs runs: every one of them ended, so the
    run is woken (True if it was). Only the job staged with the items does this: any
    other is :class:`UntrustedJob`, and nothing is written.

    When the job's batch holds every item of the map (as :func:`~workflows.store.
    insert_items` queues them), its count says none is left, and the wake is staged
    at once (one read of the map and its run, one of the batch); else the items are
    read (:func:`fan_in`)."""
    staged = _then_job_map(scope_hash, job_id, payload)
    if staged is None:
        raise UntrustedJob(
            f"job {job_id!r} is not the job the workflow engine staged to follow a map's "
            "items: it wakes no run (the engine's own handlers run only the jobs it staged)"
        )
    fault_point("workflows.map.fan_in", step=staged.step_pk)
    batch = (
        Batch.objects.filter(scope_hash=scope_hash, batch_id=batch_prefix(job_id)[:-1])
        .values_list("pending", "total")
        .first()
    )
    if batch != (0, staged.item_count):
        return fan_in(staged.step_pk, now)
    if staged.run_status not in RunStatus.unfinished():
        return False
    # Durable, as the last write of a handler must be: a worker that holds the
    # job's result through an outage finishes it once the server is back, without
    # running it again, so a wake that a crash of the server took back would never
    # be made again and the run would wait for ever.
    with transaction.atomic(using=alias()):
        wake(staged.run_pk, staged.generation, "items", staged.step_key, now=now)
    return True


def then_job_ended(scope_hash: str, job_id: str, payload: Any, now: datetime) -> bool:
    """:func:`items_ended` for the ``then`` job of a map's item jobs that ended for
    good without waking the run: False, nothing written, for any other job."""
    step_pk = then_job_step(scope_hash, job_id, payload)
    return step_pk is not None and fan_in(step_pk, now)


def items_wake_ended(job_id: str, now: datetime) -> bool:
    """The advance job ``job_id`` that a map's items' jobs batch inserted to wake its
    run (:func:`~workflows.store.items.items_wake`) ended for good before it took the
    run (its tries spent on an outage): the run, still waiting for its items, is
    woken once more, as nothing else would wake it. True if it was; False for any
    other job (no query), or a run not waiting for items."""
    run_part, _, rest = job_id.removeprefix(ADVANCE_JOB_PREFIX).partition(".")
    if not job_id.startswith(ADVANCE_JOB_PREFIX) or not run_part.isdigit():
        return False
    if rest.split(":")[1:2] != ["items"]:
        return False
    with transaction.atomic(using=alias()):
        run = (
            WorkflowRun.objects.filter(
                pk=int(run_part), status=RunStatus.WAITING, wait_kind=WaitKind.ITEMS
            )
            .values_list("pk", "generation")
            .first()
        )
        if run is None:
            return False
        wake(run[0], run[1], "released", job_id, now=now)
    return True
