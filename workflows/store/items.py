"""Activity items: a map's items and their jobs queued in one bulk submit inside the
advance's fenced transaction, each job sealed for its item; an item's tries counted
on its own row when its job cannot show the seal, and its end written on its row
when it fails for good or its job ends outside its activity (an item that succeeds
is recorded by its job's own finish: :mod:`.fanning`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from dataclasses import fields as fields_of
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Exists, QuerySet
from django.utils.crypto import salted_hmac

from jobs import store as job_store
from jobs.models import Batch, Job
from jobs.types import FINISHED_STATUSES, JobStatus, JobSubmission
from ledon.db import is_postgres
from ledon.errors import storable_text
from ledon.faults import fault_point

from ..exceptions import UntrustedJob
from ..models import WorkflowItem, WorkflowRun, WorkflowStep
from ..types import Checkpoint, DrivenRun, Item, StepStatus
from .base import alias
from .fanning import (
    ITEM_JOB_PREFIX,
    batch_prefix,
    fan_in,
    is_then_job,
    item_of,
    job_ending,
    queued,
)
from .waking import advance_job

#: Items the upkeep ends per pass (:func:`end_items_of_ended_jobs`), and items queued
#: per transaction on SQLite (:func:`items_per_transaction`).
ITEM_BATCH = 500

#: Items the checkpoint's own transaction queues at most (:func:`first_items`).
FIRST_ITEMS = 100


def items_per_transaction() -> int | None:
    """How many items (and their jobs) a transaction queues after the checkpoint's
    (:func:`first_items`): all the rest of a map on PostgreSQL (None), which locks
    rows, not the database; :data:`ITEM_BATCH` on SQLite, whose one write lock would
    keep every other writer (a worker's claim, a ``start_workflow``) waiting while a
    large map is queued."""
    if transaction.get_connection(alias()).vendor == "sqlite":
        return ITEM_BATCH
    return None


def first_items() -> int:
    """How many items the transaction that records a map's checkpoint queues with it:
    :data:`FIRST_ITEMS` (or fewer, as :func:`items_per_transaction` says), so that
    the workers start on them while the rest are queued, as plain jobs start while
    more are submitted. Every item job is of one jobs batch all the same
    (:func:`insert_items`)."""
    later = items_per_transaction()
    return FIRST_ITEMS if later is None else min(FIRST_ITEMS, later)


#: The salt of an item job's seal (see :func:`insert_items`).
_SEAL_SALT = "workflows.item"


def _sealer(scope_hash: str, count: int) -> Callable[[str, int, str], str]:
    """The seal of an item job of scope ``scope_hash`` of a map of ``count`` items,
    given its id, its item's id and arguments: an HMAC under the project's
    ``SECRET_KEY`` (a key of its own, derived from it once per map)."""
    key = salted_hmac(_SEAL_SALT, "", algorithm="sha256").digest()

    def seal(job_id: str, item_pk: int, args_json: str) -> str:
        value = "\x1f".join((scope_hash, job_id, str(item_pk), str(count), args_json))
        return hmac.new(key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    return seal


@dataclass(frozen=True, slots=True)
class SealedItem:
    """An item as its job's sealed payload names it: its row's id, its map's item
    count and its arguments (JSON text)."""

    pk: int
    count: int
    args_json: str


def sealed_item(scope_hash: str, job_id: str, payload: Any) -> SealedItem | None:
    """The item job ``job_id`` of scope ``scope_hash`` was staged for, read from its
    payload without a query when the payload's seal is the one :func:`insert_items`
    made for that job (its scope, its id, the item and its arguments, under the
    project's ``SECRET_KEY``). None otherwise (a job of an older version, a key
    rotated since, a job the engine did not stage): its item is then checked, and
    its try counted, by :func:`start_item`."""
    if not isinstance(payload, dict):
        return None
    item_pk, count = payload.get("item"), payload.get("of")
    args_json, seal = payload.get("args"), payload.get("seal")
    if (
        not isinstance(item_pk, int)
        or not isinstance(count, int)
        or not isinstance(args_json, str)
        or not isinstance(seal, str)
    ):
        return None
    expected = _sealer(scope_hash, count)(job_id, item_pk, args_json)
    if not hmac.compare_digest(seal.encode("utf-8", "surrogatepass"), expected.encode()):
        return None
    return SealedItem(pk=item_pk, count=count, args_json=args_json)


def insert_items(
    run: DrivenRun,
    step: Checkpoint,
    activity: Any,
    args: list[str],
    *,
    start: int = 0,
    prefix: str | None = None,
) -> str:
    """Items ``start`` … ``start + len(args) - 1`` of an activity or map step and one
    job per item, inside the caller's fenced transaction: one bulk insert of the
    items, then their jobs in one bulk submit, of one jobs batch in the run's scope
    (so per-scope limits apply to them): from item 0 the batch is staged, counting
    every item of the step; the items that follow, queued in later transactions,
    join it (``prefix``: the job id prefix of item 0's batch, as this returned it;
    None: read by :func:`_batch_to_extend`). The batch's ``then`` job is the run's
    advance (:func:`items_wake`): the statement that ends the last item job inserts
    it, and it takes the run and gathers the items at once.

    An item's job runs it only if the job is the one staged here: its payload
    carries the item's arguments under a seal of its scope and id (see
    :func:`sealed_item`), and a job without it is checked against the item's row
    (:func:`start_item`). The id holds a random part, so no one can take it before
    it is staged. The activity's retries are the job's: ``retries + 1`` attempts,
    the activity's back-off between them (its handler's policy).
    """
    extended = None if start == 0 else prefix or _batch_to_extend(run.scope_hash, step)
    prefix = extended or f"{ITEM_JOB_PREFIX}{run.pk}.{run.generation}:{secrets.token_hex(10)}:"
    ids = _insert_rows(step.pk, start, prefix, args)
    count = step.item_count
    seal = _sealer(run.scope_hash, count)
    jobs = []
    for index, (item_pk, args_json) in enumerate(zip(ids, args, strict=True), start):
        job_id = f"{prefix}{index}"
        payload = {"item": item_pk, "of": count, "args": args_json}
        payload["seal"] = seal(job_id, item_pk, args_json)
        sub = JobSubmission.create(
            activity.name, payload, queue=activity.queue, max_attempts=activity.retries + 1
        )
        jobs.append((job_id, sub))
    if extended is not None:
        job_store.extend_batch(run.scope_hash, prefix[:-1], jobs)
        return prefix
    # A batch of every item of the step, or (after an older version queued a map's
    # first items in a batch of their own) of these alone.
    whole = start == 0
    then_scope, then_id, then = items_wake(run, step.key, "" if whole else prefix)
    job_store.stage_batch(
        run.scope_hash,
        prefix[:-1],
        jobs,
        then,
        then_as=(then_scope, then_id),
        total=count if whole else len(args),
    )
    return prefix if whole else ""


def _batch_to_extend(scope_hash: str, step: Checkpoint) -> str | None:
    """The job id prefix of the jobs batch of ``step``'s item 0 (of a run of
    ``scope_hash``) when it counts every item of the step, so items queued after it
    join it; None when it holds its own jobs alone (an older version's, each batch
    of a map of its own)."""
    first = (
        WorkflowItem.objects.filter(step_id=step.pk, index=0)
        .values_list("job_id", flat=True)
        .first()
    )
    if first is None:
        return None
    prefix = batch_prefix(first)
    total = (
        Batch.objects.filter(scope_hash=scope_hash, batch_id=prefix[:-1])
        .values_list("total", flat=True)
        .first()
    )
    return prefix if total == step.item_count else None


def items_wake(run: DrivenRun, step_key: str, prefix: str) -> tuple[str, str, JobSubmission]:
    """The advance job that a map's items' jobs batch inserts once they all ended: the
    one :func:`~workflows.store.fan_in` would stage for the step (one job whoever
    inserts it), or, for a map queued in several batches (``prefix``: that of
    this batch's job ids; empty for a batch of every item), one of its own per batch,
    so that each batch's end wakes the run (it finds items left until the last)."""
    detail = f"{step_key}\x1f{prefix}" if prefix else step_key
    return advance_job(run.pk, run.generation, "items", detail)


def _insert_rows(step_pk: int, start: int, prefix: str, args: list[str]) -> list[int]:
    """Insert items ``start`` … of step ``step_pk``, Running, their arguments
    ``args`` and their jobs' ids ``prefix`` + index: one statement whatever their
    number (the arguments as one JSON list, no model instance each); their ids, in
    their order."""
    connection = transaction.get_connection(alias())
    q = connection.ops.quote_name
    columns = ", ".join(
        q(name)
        for name in (
            "step_id", "index", "job_id", "args_json", "status", "attempts", "error_type", "error",
        )
    )  # fmt: skip
    if connection.vendor == "postgresql":
        elements = "json_array_elements_text(%s::json) WITH ORDINALITY AS e(value, n)"
        index = "(e.n - 1 + %s)::integer"
    else:
        elements = "json_each(%s) AS e"
        index = "(e.key + %s)"
    sql = (
        f"INSERT INTO {q(WorkflowItem._meta.db_table)} ({columns})"
        f" SELECT %s, {index}, %s || {index}, e.value, %s, 0, '', '' FROM {elements}"
        f" RETURNING {q('id')}, {q('index')}"
    )
    params = [step_pk, start, prefix, start, StepStatus.RUNNING.value, json.dumps(args)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = dict((index, pk) for pk, index in cursor.fetchall())
    return [ids[index] for index in range(start, start + len(args))]


def items_queued(step: Checkpoint) -> int:
    """How many items of ``step`` are queued (inserted) so far: an older version,
    which queued a large map in several transactions, may have stopped between
    two of them and left fewer than ``item_count``."""
    return queued(step.pk)


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
    is written. One guarded ``UPDATE … RETURNING``, its own transaction. A job's
    first try whose payload shows its seal (:func:`sealed_item`) skips it: an item
    that succeeds at once costs no statement of its own.
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
        return _item_from(row)
    ended = staged_items(scope_hash, job_id).filter(pk=item_pk).first()
    if ended is None:
        raise UntrustedJob(
            f"job {job_id!r} was not staged for workflow item {item_pk}: it runs nothing "
            "(the engine's own handlers run only the jobs it staged)"
        )
    fan_in(ended.step_id, now)
    return item_of(ended)


def _item_from(row: Sequence[Any]) -> Item:
    """The item of ``row``, its columns :data:`_ITEM_STARTED` read by raw SQL."""
    item = dict(zip(_ITEM_STARTED, row, strict=True))
    item["pk"] = item.pop("id")
    item["status"] = StepStatus(item["status"])
    return Item(**item)


def item_at(item_pk: int) -> Item:
    """Item ``item_pk`` as its row stands (a sealed job's try that must write on it)."""
    return item_of(WorkflowItem.objects.get(pk=item_pk))


def end_item(
    item: Item,
    status: StepStatus,
    now: datetime,
    *,
    result_json: str | None = None,
    error_type: str = "",
    error: str = "",
    token: str | None = None,
    attempts: int | None = None,
) -> bool:
    """Record an item's end (a guarded update of the item's own row, so items of one
    map never wait on each other's locks), then :func:`fan_in`. False if the item
    had ended already (nothing written; the check is made again all the same).

    ``token``: the item job's attempt that ran this try. Its end is written only
    while that attempt is still the job's current one: a try that ran past its
    timeout, or whose lease another worker recovered, is fenced off like any late
    finish, and the try that took over records the item. ``attempts``: the tries
    its job made (a first try read from the job's seal counted none on the row)."""
    fault_point("workflows.item.before_end", item=item.pk)
    still_running = WorkflowItem.objects.filter(pk=item.pk, status=StepStatus.RUNNING)
    if token is not None:
        still_running = still_running.filter(
            Exists(Job.objects.filter(current_token=token, status=JobStatus.RUNNING))
        )
    # One guarded statement, its own transaction (one round trip, one commit).
    fields: dict[str, Any] = {} if attempts is None else {"attempts": attempts}
    ended = still_running.update(
        status=status,
        result_json=result_json,
        error_type=error_type[:200],
        error=storable_text(error),
        finished_at=now,
        **fields,
    )
    if ended:
        fault_point("workflows.map.item_ended", item=item.pk)
    fan_in(item.step_id, now)
    return bool(ended)


def record_item_error(item: Item, error_type: str, error: str) -> None:
    """Keep a failed try's error on an item that will be tried again."""
    WorkflowItem.objects.filter(pk=item.pk, status=StepStatus.RUNNING).update(
        error_type=error_type[:200], error=storable_text(error)
    )


def end_items_of_ended_jobs(
    now: datetime, *, limit: int = ITEM_BATCH, job: tuple[str, str] | None = None
) -> int:
    """End up to ``limit`` items still Running whose job has ended for good without
    recording them, and return how many: the job ended Interrupted after its
    worker kept dying, or its worker was killed between the job's end and the
    signal that ends the item. Their steps end, their runs are woken. An item its
    job recorded (Succeeded with its result) is left to its run's fan-in. ``job``
    (scope hash, job id): only the item that job was staged for (the word of its
    end came: see :mod:`workflows.receivers`).

    The items and their jobs are read as one set, in one statement (see
    :func:`_items_of_ended_jobs_sql`): each Running item joined to its job through
    the jobs' identity index."""
    connection = transaction.get_connection(alias())
    params: list[Any] = [*_ENDINGS, JobStatus.SUCCEEDED.value, StepStatus.RUNNING.value]
    if job is not None:
        run_pk = run_of_item_job(job[1])
        if run_pk is None:
            return 0
        params += [run_pk, job[0], job[1]]
    with connection.cursor() as cursor:
        sql = _items_of_ended_jobs_sql(connection, one_job=job is not None)
        cursor.execute(sql, [*params, limit])
        rows = cursor.fetchall()
    ended = 0
    for row in rows:
        item = _item_from(row[: len(_ITEM_STARTED)])
        job_status, job_error, job_tries = row[len(_ITEM_STARTED) :]
        outcome, error_type, text = job_ending(job_status, job_error)
        attempts = max(item.attempts, job_tries)
        ended += end_item(item, outcome, now, error_type=error_type, error=text, attempts=attempts)
    return ended


#: How a job ends for good (one that recorded its item: Succeeded, with its result).
_ENDINGS = tuple(status.value for status in FINISHED_STATUSES)


def _items_of_ended_jobs_sql(connection: BaseDatabaseWrapper, *, one_job: bool) -> str:
    """The statement of :func:`end_items_of_ended_jobs`: the Running items (through
    their partial index) joined to their steps and runs by primary key, each to its
    job by the jobs' identity (scope hash, job id), a unique index; those whose job
    ended for good without recording its item (anything but Succeeded with a
    result), with the job's status, error and tries, at most a limit of them. No
    order: each pass ends what it read, so the next reads the rest. ``one_job``:
    only the item of the job of a run, a scope and an id.

    On PostgreSQL the job is a ``LATERAL`` subquery behind a ``LIMIT``, which the
    planner cannot turn into a plain join: it is read by its identity for each item,
    never by a scan of the jobs' table that statistics lagging behind the table
    (finished jobs taken for rare) would make look cheap. SQLite joins by nested
    loops only, and looks each job up by that index."""
    q = connection.ops.quote_name
    columns = ", ".join(f"i.{q(name)}" for name in _ITEM_STARTED)
    endings = ", ".join(["%s"] * len(_ENDINGS))
    job_table = q(Job._meta.db_table)
    its_job = (
        f"j.{q('scope_hash')} = r.{q('scope_hash')} AND j.{q('job_id')} = i.{q('job_id')}"
        f" AND j.{q('status')} IN ({endings})"
        f" AND (j.{q('result_ref')} IS NULL OR j.{q('status')} <> %s)"
    )
    tries = f"j.{q('attempt_count')} + j.{q('interruption_count')}"
    if is_postgres(connection):
        job = (
            f" CROSS JOIN LATERAL (SELECT j.{q('status')}, j.{q('error')}, {tries} AS tries"
            f" FROM {job_table} j WHERE {its_job} LIMIT 1) AS ended"
        )
        job_columns = f"ended.{q('status')}, ended.{q('error')}, ended.tries"
    else:
        job = f" INNER JOIN {job_table} j ON {its_job}"
        job_columns = f"j.{q('status')}, j.{q('error')}, {tries}"
    only = (
        f" AND s.{q('run_id')} = %s AND r.{q('scope_hash')} = %s AND i.{q('job_id')} = %s"
        if one_job
        else ""
    )
    return (
        f"SELECT {columns}, {job_columns}"
        f" FROM {q(WorkflowItem._meta.db_table)} i"
        f" INNER JOIN {q(WorkflowStep._meta.db_table)} s ON s.{q('id')} = i.{q('step_id')}"
        f" INNER JOIN {q(WorkflowRun._meta.db_table)} r ON r.{q('id')} = s.{q('run_id')}"
        f"{job} WHERE i.{q('status')} = %s{only} LIMIT %s"
    )


def run_of_item_job(job_id: str) -> int | None:
    """The run (its row's id) whose item job ``job_id`` is, read from the id
    (``wf-item:{run}.{generation}:…``); None for any other id."""
    if not job_id.startswith(ITEM_JOB_PREFIX):
        return None
    run_pk = job_id.removeprefix(ITEM_JOB_PREFIX).split(".", 1)[0]
    return int(run_pk) if run_pk.isdigit() else None


def item_job_cancelled(scope_hash: str, job_id: str, now: datetime) -> bool:
    """An item's job was cancelled before its handler recorded the item (its scope's
    caller or the admin cancelled it while Queued, or while it waited in a worker's
    look-ahead): record the item Cancelled so its step can end. False if ``job_id``
    names no running item of that scope (any other job: no query). The ``then``
    job of a map's item jobs, cancelled, wakes the run if its items ended."""
    if not job_id.startswith(ITEM_JOB_PREFIX):
        return False
    if is_then_job(job_id):
        step_pk = (
            WorkflowItem.objects.filter(
                step__run__scope_hash=scope_hash, job_id__startswith=batch_prefix(job_id)
            )
            .values_list("step_id", flat=True)
            .first()
        )
        if step_pk is None:
            return False
        # The items' ``then`` job, cancelled by the scope's caller: the run is woken
        # all the same if its items ended (nothing else would wake it).
        fan_in(step_pk, now)
        return True
    run_pk = run_of_item_job(job_id)
    if run_pk is None:
        return False
    item = WorkflowItem.objects.filter(
        step__run_id=run_pk,
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
