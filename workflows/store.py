"""Every state transition of runs, checkpoints, items and signals.

Each transition is one guarded statement — it succeeds only from the states that
allow it — inside ``transaction.atomic``, and returns a typed outcome or raises a
typed error. Nothing else in the app writes to the workflows tables.

    create_run / stage ........ (new) -> WAITING + its first advance job
    take ...................... WAITING (or RUNNING, its own job again) -> RUNNING,
                                new driver token; else RUNNING + wake pending
    guard ..................... every checkpoint write: fenced by the driver token
    suspend ................... RUNNING (token, no wake pending) -> WAITING (what for,
                                until when); a pending wake: replay again
    finish .................... RUNNING (token) -> SUCCEEDED | FAILED | CANCELLED
    start_item / end_item ..... an item's tries and its end (its own row only);
    fan_in .................... after an item's end: none left running -> wake the run
    send_signal ............... (new signal); wakes the run if it may wait for it
    cancel .................... WAITING -> CANCELLED; RUNNING -> cancel requested
    resume .................... FAILED -> WAITING (failed checkpoints erased)
    purge_finished ............ finished before a cutoff -> (deleted)

A run is woken by an advance job of the workflows' own handler, staged in the same
transaction as the change that wakes it. Its job id is deterministic (the run's row
id, its generation and what woke it), so two writers that race to wake a run for the
same reason create one job, and a replayed writer finds its job already there.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, F, Func, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.base import ModelState
from django.utils import timezone

from jobs import store as job_store
from jobs import validation as job_validation
from jobs.models import Job
from jobs.types import FINISHED_STATUSES, JobStatus, JobSubmission
from ledon.db import alias_for, in_caller_atomic_block
from ledon.errors import storable_text
from ledon.faults import fault_point

from .conf import workflows_settings
from .exceptions import (
    AmbientTransactionError,
    InvalidTransition,
    ResultsTooLarge,
    ResumeWouldFail,
    RunNotFound,
    SignalConflict,
    TooManyItems,
    TransactionRequiredError,
    UntrustedJob,
    WorkflowIdentityConflict,
)
from .models import WorkflowItem, WorkflowRun, WorkflowSignal, WorkflowStep
from .observability import hooks
from .types import (
    CancelOutcome,
    ItemCounts,
    RunSnapshot,
    RunStatus,
    SignalOutcome,
    StepKind,
    StepSnapshot,
    StepStatus,
)
from .validation import child_run_id, from_json

#: The job handler that advances runs (registered by :mod:`workflows.handlers`).
ADVANCE_HANDLER = "workflows.advance"
#: Tries of an advance job: only database outages and kills fail one; the body's
#: own errors are recorded on the run, never raised to the job.
ADVANCE_MAX_ATTEMPTS = 25
#: Items (with their jobs) queued per transaction: a large map is queued in
#: batches, each its own fenced transaction, so that no write lock is held long.
ITEM_BATCH = 500
#: The reserved scope of the advance jobs (see :func:`advance_scope_hash`).
ADVANCE_SCOPE = "workflows"


class StaleDriver(Exception):
    """This driver's token is no longer the run's: another driver took the run (or it
    finished, or was cancelled). The write rolled back; the driver stops."""


def advance_scope_hash() -> str:
    """The scope of the jobs that advance runs: the reserved scope "workflows".

    The one place that chooses it. A reserved scope hashes in a namespace of its own,
    so ``JobScope("workflows")`` is a tenant that can never see, cancel or retry these
    jobs; trusted code reaches them with ``execution.reserved_scope("workflows")``.
    """
    return job_validation.reserved_scope_hash(ADVANCE_SCOPE)


def now_or(now: datetime | None) -> datetime:
    return timezone.now() if now is None else now


def alias() -> str:
    return alias_for(WorkflowRun)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


# -- waking runs -------------------------------------------------------------------


#: The prefix of every advance job's id: ``wf:{run}.{generation}:{reason}``.
ADVANCE_JOB_PREFIX = "wf:"


def advance_job_prefix(run_pk: int) -> str:
    """The start of the id of every advance job of run ``run_pk`` (see :func:`wake`)."""
    return f"{ADVANCE_JOB_PREFIX}{run_pk}."


def wake(
    run_pk: int,
    generation: int,
    reason: str,
    detail: str = "",
    *,
    not_before: datetime | None = None,
    now: datetime | None = None,
) -> None:
    """Stage the advance job that wakes run ``run_pk`` for ``reason`` (inside the
    caller's transaction: it exists if and only if the change that wakes the run
    commits). The same reason and detail make the same job: exactly one however
    many writers race."""
    job_id = f"{advance_job_prefix(run_pk)}{generation}:{reason}"
    if detail:
        job_id += f":{_digest(detail)}"
    sub = JobSubmission.create(
        ADVANCE_HANDLER,
        {"run": run_pk},
        queue=workflows_settings().ADVANCE_QUEUE,
        max_attempts=ADVANCE_MAX_ATTEMPTS,
        not_before=not_before,
    )
    job_store.stage(advance_scope_hash(), job_id, sub, now=now)


def staged_advance(scope_hash: str, job_id: str, payload: Any) -> int:
    """The run an advance job may advance: the one :func:`wake` staged it for.

    Its id is predictable (it must be: racing writers make one job of it), so it is
    no capability; the reserved scope is, which no tenant reaches. A job of another
    scope, or whose id is not one of its run's advance ids, is :class:`UntrustedJob`:
    it advances nothing and releases nothing."""
    run_pk = payload.get("run") if isinstance(payload, dict) else None
    if (
        scope_hash != advance_scope_hash()
        or not isinstance(run_pk, int)
        or isinstance(run_pk, bool)
        or not job_id.startswith(advance_job_prefix(run_pk))
    ):
        raise UntrustedJob(
            f"job {job_id!r} is no advance job the workflow engine staged: it advances "
            "no run (the engine's own handlers run only the jobs it staged)"
        )
    return run_pk


def drop_wakes(run_pks: list[int], now: datetime) -> int:
    """Cancel the Queued advance jobs of runs ``run_pks`` (a timer, a signal's
    timeout, a retry's wake-up), which finished or are purged: one guarded statement,
    in the caller's transaction, so that no wake-up of a finished run stays Queued."""
    prefixes = [advance_job_prefix(pk) for pk in run_pks]
    return job_store.cancel_queued(advance_scope_hash(), prefixes, now=now)


# -- creating runs -------------------------------------------------------------------


def _create(
    scope_hash: str,
    run_id: str,
    name: str,
    version: int,
    input_json: str,
    now: datetime,
    parent: WorkflowRun | None = None,
    parent_key: str = "",
    *,
    any_version: bool = False,
) -> RunSnapshot:
    """Insert the run and its first advance job, or return the same request's run.
    ``any_version``: the caller named no version, so a run of any version of ``name``
    is the same request (a retry after a deploy that added a version finds the run
    it started). Runs inside the caller's atomic block."""
    try:
        with transaction.atomic(using=alias()):
            run = WorkflowRun.objects.create(
                scope_hash=scope_hash,
                run_id=run_id,
                name=name,
                version=version,
                input_json=input_json,
                status=RunStatus.WAITING,
                waiting_for="start",
                parent=parent,
                parent_key=parent_key,
                created_at=now,
                updated_at=now,
            )
    except IntegrityError:
        existing = WorkflowRun.objects.for_scope(scope_hash).filter(run_id=run_id).first()
        if existing is None:
            raise
        differing = [
            field
            for field, stored, asked in (
                ("name", existing.name, name),
                ("version", existing.version, existing.version if any_version else version),
                ("input", existing.input_json, input_json),
            )
            if stored != asked
        ]
        if differing:
            raise WorkflowIdentityConflict(
                f"run {run_id!r} exists in this scope as {existing.name!r} version "
                f"{existing.version} with another {', '.join(differing)}; a run id names "
                "one request"
            ) from None
        return snapshot(existing, created=False)
    wake(run.pk, 0, "start", now=now)
    transaction.on_commit(lambda: hooks.started(name, version), using=alias())
    return snapshot(run, created=True, with_steps=False)


def create_run(
    scope_hash: str,
    run_id: str,
    name: str,
    version: int,
    input_json: str,
    *,
    staged: bool,
    any_version: bool = False,
) -> RunSnapshot:
    """Create a run: in its own transaction (``staged`` False; refuses the caller's
    atomic block) or inside the caller's (``staged`` True; requires one).
    ``any_version``: see :func:`_create`."""
    using = alias()
    inside = in_caller_atomic_block(transaction.get_connection(using))
    if staged and not inside:
        raise TransactionRequiredError()
    if not staged and inside:
        raise AmbientTransactionError()
    now = timezone.now()
    if staged:
        try:
            return _create(
                scope_hash, run_id, name, version, input_json, now, any_version=any_version
            )
        except WorkflowIdentityConflict:
            # Like stage_job: the caller's work cannot commit without its run.
            transaction.set_rollback(True, using=using)
            raise
    with transaction.atomic(using=using):
        return _create(scope_hash, run_id, name, version, input_json, now, any_version=any_version)


def create_child(
    parent: WorkflowRun, key: str, name: str, version: int, input_json: str, now: datetime
) -> WorkflowRun:
    """Create the child run ``"{run_id}/{key}"`` in the parent's scope (inside the
    parent's fenced transaction); the same child again is the existing run.

    A run of that id that is not this parent's child (a caller started it) is
    :class:`WorkflowIdentityConflict`: it would never wake the parent when it ends."""
    run_id = child_run_id(parent.run_id, key)
    _create(
        parent.scope_hash, run_id, name, version, input_json, now, parent=parent, parent_key=key
    )
    child = WorkflowRun.objects.for_scope(parent.scope_hash).get(run_id=run_id)
    if child.parent_id != parent.pk:
        raise WorkflowIdentityConflict(
            f"run {run_id!r} exists in this scope and is not the child {key!r} of run "
            f"{parent.run_id!r}; a child's run id is the parent's, '/', and its key"
        )
    return child


# -- driving a run -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Driver:
    """A worker's hold on a run for one advance: the run row as taken and its token."""

    run: WorkflowRun
    token: str

    def held(self) -> QuerySet[WorkflowRun]:
        """The run's row while this driver still holds it (RUNNING under its token),
        else nothing: the fence of every write a driver makes to its run."""
        return WorkflowRun.objects.filter(
            pk=self.run.pk, driver_token=self.token, status=RunStatus.RUNNING
        )


def take(run_pk: int, job_id: str | None = None, *, now: datetime | None = None) -> Driver | None:
    """Take the run for one advance -> RUNNING with a new driver token.

    From WAITING; or from RUNNING when ``job_id`` is the advance job that took it last
    (that job's worker was killed, or its advance failed on an outage, and the job
    runs again), or when no job is named (an operator's or a test's direct call).
    Another job that finds the run RUNNING does not take it over — it would run the
    current step a second time beside the live driver — but leaves a wake-up for
    that driver, which then replays once more before it waits. None if the run was
    not taken.
    """
    now = now_or(now)
    token = uuid.uuid4().hex
    takeable = Q(status=RunStatus.WAITING)
    if job_id is None:
        takeable |= Q(status=RunStatus.RUNNING)
    else:
        takeable |= Q(status=RunStatus.RUNNING, driver_job=job_id)
    with transaction.atomic(using=alias()):
        # The row locked first: a driver that suspends the run meanwhile is ordered
        # before or after this whole decision, so a wake-up it refuses is never lost
        # to a run that went Waiting between its two statements.
        _lock_run(run_pk)
        taken = WorkflowRun.objects.filter(takeable, pk=run_pk).update(
            status=RunStatus.RUNNING,
            driver_token=token,
            driver_job=job_id,
            wake_pending=False,
            advances=F("advances") + 1,
            updated_at=now,
        )
        if not taken:
            fault_point("workflows.take.refused", run=run_pk)
            WorkflowRun.objects.filter(pk=run_pk, status=RunStatus.RUNNING).update(
                wake_pending=True
            )
            return None
        run = WorkflowRun.objects.get(pk=run_pk)
    return Driver(run, token)


def _lock_run(run_pk: int) -> str | None:
    """Lock run ``run_pk``'s row until the transaction ends (PostgreSQL; SQLite's
    transactions hold the one write lock already) and return its status."""
    return (
        WorkflowRun.objects.select_for_update()
        .filter(pk=run_pk)
        .values_list("status", flat=True)
        .first()
    )


def guard(driver: Driver, now: datetime) -> None:
    """The fence: touch the run row only if this driver still holds it. On PostgreSQL
    the row stays locked until the transaction ends, which orders this transaction
    with signal senders and cancels."""
    held = driver.held().update(updated_at=now)
    if not held:
        raise StaleDriver(f"run {driver.run.run_id!r}: another driver holds it")


def cancel_requested(run_pk: int) -> bool:
    return bool(WorkflowRun.objects.filter(pk=run_pk, cancel_requested=True).exists())


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


def check_item_count(key: str, count: int) -> None:
    """:class:`TooManyItems` if a map of ``count`` items is over
    ``WORKFLOWS["MAX_MAP_ITEMS"]`` (before anything is serialised or written)."""
    bound = workflows_settings().MAX_MAP_ITEMS
    if count > bound:
        raise TooManyItems(
            f"map {key!r}: {count} items, more than WORKFLOWS['MAX_MAP_ITEMS'] ({bound}); "
            "split them over several maps (or child runs), or raise the bound"
        )


def insert_items(
    step: WorkflowStep, scope_hash: str, activity: Any, args: list[str], *, start: int = 0
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
    run = step.run
    nonce = secrets.token_hex(10)
    items = [
        WorkflowItem(
            step=step,
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
                step=step, index__gte=start, index__lt=start + len(items)
            ).values_list("index", "pk")
        )
        for item in items:
            item.pk = ids[item.index]
    job_store.stage_many(
        [
            (
                scope_hash,
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


#: Seconds between two batches of a map's items on SQLite (see :func:`let_writers_in`).
SQLITE_BATCH_PAUSE = 0.1


def let_writers_in() -> None:
    """Before the next batch of a map's items: on SQLite, whose one write lock has no
    queue, pause as long as a writer waiting for it takes between two tries (its busy
    handler retries every 100 ms), so that the driver does not take the lock back
    before the ``start_workflow`` or the worker waiting for it gets it. PostgreSQL
    has no such lock: no pause."""
    if transaction.get_connection(alias()).vendor == "sqlite":
        time.sleep(SQLITE_BATCH_PAUSE)


def items_queued(step: WorkflowStep) -> int:
    """How many items of ``step`` are queued (inserted) so far: a driver stopped
    while it queued a large map's batches left fewer than ``item_count``."""
    last = (
        WorkflowItem.objects.filter(step_id=step.pk)
        .order_by("-index")
        .values_list("index", flat=True)
        .first()
    )
    return 0 if last is None else last + 1


class Suspended(enum.Enum):
    """How :func:`suspend` went."""

    #: The run is WAITING.
    WAITING = "waiting"
    #: A wake-up came while this driver replayed: replay again (the flag is cleared).
    WAKE_PENDING = "wake_pending"
    #: The run's cancel was requested while this driver held it: the driver ends it
    #: Cancelled (:func:`finish`) instead of letting it wait.
    CANCEL_REQUESTED = "cancel_requested"
    #: This driver no longer holds the run.
    STALE = "stale"


def suspend(driver: Driver, waiting_for: str, wake_at: datetime | None, now: datetime) -> Suspended:
    """RUNNING (this driver, no wake-up pending, no cancel requested) -> WAITING: the
    advance ends without holding a slot. A wake-up left meanwhile (a signal, the last
    item, a child's end, another advance job) makes the driver replay instead, so none
    is lost; a cancel requested meanwhile makes it end the run, so that no run waits
    with a cancel nobody will act on."""
    held = driver.held()
    with transaction.atomic(using=alias()):
        if held.filter(wake_pending=False, cancel_requested=False).update(
            status=RunStatus.WAITING,
            driver_token=None,
            driver_job=None,
            waiting_for=waiting_for[:500],
            wake_at=wake_at,
            updated_at=now,
        ):
            return Suspended.WAITING
        if held.filter(cancel_requested=True).exists():
            return Suspended.CANCEL_REQUESTED
        if held.filter(wake_pending=True).update(wake_pending=False, updated_at=now):
            return Suspended.WAKE_PENDING
    return Suspended.STALE


def finish(
    driver: Driver,
    status: RunStatus,
    now: datetime,
    *,
    output_json: str | None = None,
    error: str = "",
    failed_step: str = "",
) -> bool:
    """RUNNING (this driver) -> SUCCEEDED, FAILED or CANCELLED; wakes the parent run.
    False (nothing written) if the driver is stale."""
    with transaction.atomic(using=alias()):
        done = driver.held().update(
            status=status,
            driver_token=None,
            driver_job=None,
            output_json=output_json,
            error=storable_text(error),
            failed_step=failed_step,
            waiting_for="",
            wake_at=None,
            finished_at=now,
            updated_at=now,
        )
        if not done:
            return False
        if status is RunStatus.CANCELLED:
            _cancel_dependents(driver.run, now)
        drop_wakes([driver.run.pk], now)
        _wake_parent(driver.run, now)
    return True


def _wake_parent(run: WorkflowRun, now: datetime) -> None:
    if run.parent_id is None:
        return
    generation = (
        WorkflowRun.objects.filter(pk=run.parent_id).values_list("generation", flat=True).first()
    )
    if generation is not None:
        wake(run.parent_id, generation, "child", run.parent_key, now=now)


# -- items -------------------------------------------------------------------------


#: What an item's try reads back from the statement that counts it.
_ITEM_STARTED = (
    "id",
    "step_id",
    "index",
    "status",
    "attempts",
    "args_json",
    "error_type",
    "error",
    "job_id",
)


def _staged_items(scope_hash: str, job_id: str) -> QuerySet[WorkflowItem]:
    """The items job ``job_id`` of scope ``scope_hash`` was staged for: the item
    names its job, and its run is of that scope."""
    return WorkflowItem.objects.filter(job_id=job_id, step__run__scope_hash=scope_hash)


def start_item(item_pk: int, scope_hash: str, job_id: str, now: datetime) -> WorkflowItem:
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
        item = WorkflowItem.__new__(WorkflowItem)
        item.__dict__.update(zip(_ITEM_STARTED, row, strict=True))
        item._state = ModelState()
        item._state.adding = False
        item._state.db = alias()
        return item
    ended = _staged_items(scope_hash, job_id).filter(pk=item_pk).first()
    if ended is None:
        raise UntrustedJob(
            f"job {job_id!r} was not staged for workflow item {item_pk}: it runs nothing "
            "(the engine's own handlers run only the jobs it staged)"
        )
    fan_in(ended.step_id, now)
    return ended


def end_item(
    item: WorkflowItem,
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
        if step is None or items_queued(step) < step.item_count:
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


def items_left(step: WorkflowStep) -> int:
    """How many items of ``step`` have not ended."""
    return WorkflowItem.objects.filter(step_id=step.pk, status=StepStatus.RUNNING).count()


class _OctetLength(Func):
    """Bytes of a text column's UTF-8 (``MAX_VALUE_BYTES`` counts bytes)."""

    function = "OCTET_LENGTH"

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))")


def _results_bytes(step_id: int, *, excluding: int | None = None) -> tuple[int, int]:
    """(items succeeded, bytes of their results' JSON) of step ``step_id``."""
    rows = WorkflowItem.objects.filter(step_id=step_id, status=StepStatus.SUCCEEDED)
    if excluding is not None:
        rows = rows.exclude(pk=excluding)
    totals = rows.aggregate(count=Count("id"), size=Sum(_OctetLength("result_json")))
    return totals["count"] or 0, totals["size"] or 0


def check_results_size(item: WorkflowItem, result_json: str) -> None:
    """:class:`ResultsTooLarge` if ``item``'s result would make its map's results,
    as one JSON list, larger than ``WORKFLOWS["MAX_VALUE_BYTES"]`` (checked as each
    item ends, not once they all ran: the map fails on the item that does not fit).

    A result within its share of the bound (the bound over the map's item count)
    always fits: no query. A larger one is added to the results recorded so far,
    counting every item not ended yet as the shortest result."""
    bound = workflows_settings().MAX_VALUE_BYTES
    size = len(result_json.encode("utf-8"))
    count = (
        WorkflowStep.objects.filter(pk=item.step_id).values_list("item_count", flat=True).first()
    )
    # A list of n results is "[" + n results joined by "," + "]": 1 + sum(size + 1).
    if count is None or count <= 1 or 1 + (size + 1) * count <= bound:
        return
    ended, ended_bytes = _results_bytes(item.step_id, excluding=item.pk)
    least = 1 + (ended_bytes + ended) + (size + 1) + 2 * (count - ended - 1)
    if least > bound:
        raise ResultsTooLarge(
            f"its result ({size} bytes) makes the results of the map's {count} items "
            f"at least {least} bytes of JSON, more than "
            f"WORKFLOWS['MAX_VALUE_BYTES'] ({bound}); return less per item (a reference "
            "to data stored elsewhere), or map fewer items"
        )


def refuse_hopeless_resume(run: WorkflowRun) -> None:
    """:class:`ResumeWouldFail` if resuming ``run`` would fail it again the same way:
    a map whose items all succeeded but whose results are larger than
    ``WORKFLOWS["MAX_VALUE_BYTES"]`` (recorded before the bound was checked as
    items end, or under a larger bound) would be replayed to the same failure."""
    bound = workflows_settings().MAX_VALUE_BYTES
    running = WorkflowStep.objects.filter(
        run=run, kind=StepKind.MAP, status=StepStatus.RUNNING
    ).values_list("pk", "key", "item_count")
    for step_pk, key, count in running:
        if WorkflowItem.objects.filter(step_id=step_pk, status=StepStatus.RUNNING).exists():
            continue
        succeeded, size = _results_bytes(step_pk)
        if succeeded == count and 1 + size + count > bound:
            raise ResumeWouldFail(
                f"run {run.run_id!r}: the results of map {key!r} are {1 + size + count} "
                f"bytes of JSON, more than WORKFLOWS['MAX_VALUE_BYTES'] ({bound}); a resume "
                "would fail the same way: raise the bound first, or cancel the run"
            )


def release(scope_hash: str, job_id: str, now: datetime) -> bool:
    """RUNNING (held by advance job ``job_id``, which failed for good) -> WAITING, with
    a new advance job: no other job may take a Running run, so without this the run
    would wait for ever. False if that job did not hold any run, or is no advance job
    of the reserved scope (a job of any other scope releases nothing)."""
    if scope_hash != advance_scope_hash():
        return False
    with transaction.atomic(using=alias()):
        run = WorkflowRun.objects.filter(driver_job=job_id, status=RunStatus.RUNNING).first()
        if run is None:
            return False
        released = WorkflowRun.objects.filter(
            pk=run.pk, driver_job=job_id, status=RunStatus.RUNNING
        ).update(
            status=RunStatus.WAITING,
            driver_token=None,
            driver_job=None,
            wake_pending=False,
            waiting_for="a new advance (the last one failed)",
            updated_at=now,
        )
        if released:
            wake(run.pk, run.generation, "released", f"{job_id}@{run.advances}", now=now)
        return bool(released)


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
        return _cancel(run, now)


#: The prefix of every item job's id (see :func:`insert_items`).
ITEM_JOB_PREFIX = "wf-item:"


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
    staged = _staged_items(scope_hash, job_id).filter(pk=item_pk)
    item = staged.filter(status=StepStatus.RUNNING).first()
    if item is None:
        step_id = staged.values_list("step_id", flat=True).first()
        if step_id is not None:
            fan_in(step_id, now)  # its end may have committed just before a kill
        return False
    return end_item(item, StepStatus.FAILED, now, error_type=error_type, error=error)


def end_items_of_ended_jobs(now: datetime, *, limit: int = ITEM_BATCH) -> int:
    """End up to ``limit`` items still Running whose job has ended for good without
    recording them, and return how many: the job ended Interrupted after its
    worker kept dying, or its worker was killed between the job's end and the
    signal that ends the item. Their steps end, their runs are woken."""
    ended_job = Job.objects.filter(
        scope_hash=OuterRef("step__run__scope_hash"),
        job_id=OuterRef("job_id"),
        status__in=FINISHED_STATUSES,
    )
    items = (
        WorkflowItem.objects.filter(status=StepStatus.RUNNING)
        .annotate(
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
        ended += end_item(item, outcome, now, error_type=error_type, error=text)
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
        item, StepStatus.CANCELLED, now, error_type="Cancelled", error="its job was cancelled"
    )


def record_item_error(item: WorkflowItem, error_type: str, error: str) -> None:
    """Keep a failed try's error on an item that will be tried again."""
    WorkflowItem.objects.filter(pk=item.pk, status=StepStatus.RUNNING).update(
        error_type=error_type[:200], error=storable_text(error)
    )


def item_counts(step: WorkflowStep) -> ItemCounts:
    rows = dict(
        WorkflowItem.objects.filter(step=step)
        .values_list("status")
        .annotate(n=Count("id"))
        .order_by()
    )
    return _counts(step, rows)


def items_of(step: WorkflowStep) -> list[WorkflowItem]:
    return list(WorkflowItem.objects.filter(step=step).order_by("index"))


# -- signals -----------------------------------------------------------------------


def _run_in_scope(scope_hash: str, run_id: str, *, lock: bool = False) -> WorkflowRun:
    rows = WorkflowRun.objects.for_scope(scope_hash).filter(run_id=run_id)
    if lock:
        rows = rows.select_for_update()
    run = rows.first()
    if run is None:
        raise RunNotFound(f"no run {run_id!r} in this scope")
    return run


def send_signal(scope_hash: str, run_id: str, key: str, payload_json: str) -> SignalOutcome:
    """Record a signal for a run and wake the run unless it waits for something else.

    Works in its own transaction or inside the caller's (then it is delivered only if
    that commits). The run row is locked first, so a driver that is about to wait for
    this key either sees the signal or is woken by it.
    """
    now = timezone.now()
    with transaction.atomic(using=alias()):
        run = _run_in_scope(scope_hash, run_id)
        # Lock the run row (an unconditional touch): orders this transaction with the
        # driver's fenced writes.
        WorkflowRun.objects.filter(pk=run.pk).update(updated_at=F("updated_at"))
        run.refresh_from_db(fields=["status", "waiting_for", "generation"])
        existing = WorkflowSignal.objects.filter(run=run, key=key).first()
        if existing is not None:
            if existing.payload_json != payload_json:
                raise SignalConflict(
                    f"signal {key!r} was already sent to run {run_id!r} with another payload"
                )
            return SignalOutcome.ALREADY_SENT
        if run.status in RunStatus.finished():
            return SignalOutcome.RUN_FINISHED
        WorkflowSignal.objects.create(run=run, key=key, payload_json=payload_json, created_at=now)
        fault_point("workflows.signal.deliver", run=run.pk, key=key)
        if run.status == RunStatus.RUNNING:
            # The driver replays once more before it waits (see suspend).
            WorkflowRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
                wake_pending=True
            )
        elif run.waiting_for == signal_wait(key):
            wake(run.pk, run.generation, "signal", key, now=now)
        # Waiting for anything else (its first advance, a timer, items…): the run
        # reads the kept signal when its body reaches the wait.
    return SignalOutcome.DELIVERED


def signal_wait(key: str) -> str:
    """What a run waiting for signal ``key`` says it waits for."""
    return f"signal {key}"


def signal_payload(run: WorkflowRun, key: str) -> tuple[bool, Any]:
    payload = (
        WorkflowSignal.objects.filter(run=run, key=key)
        .values_list("payload_json", flat=True)
        .first()
    )
    return (payload is not None, from_json(payload))


# -- control -------------------------------------------------------------------------


def cancel(scope_hash: str, run_id: str) -> CancelOutcome:
    """A waiting run ends Cancelled at once; a running one is asked to stop (it ends
    Cancelled at its next checkpoint). Unfinished children and running activity items
    are cancelled with it."""
    now = timezone.now()
    with transaction.atomic(using=alias()):
        run = _run_in_scope(scope_hash, run_id)
        return _cancel(run, now)


def _cancel(run: WorkflowRun, now: datetime) -> CancelOutcome:
    # Locked first: a run its driver suspends between the two guarded statements
    # below would otherwise match neither, and the cancel would be lost.
    _lock_run(run.pk)
    ended = WorkflowRun.objects.filter(pk=run.pk, status=RunStatus.WAITING).update(
        status=RunStatus.CANCELLED,
        cancel_requested=True,
        driver_token=None,
        waiting_for="",
        wake_at=None,
        finished_at=now,
        updated_at=now,
    )
    if ended:
        _cancel_dependents(run, now)
        drop_wakes([run.pk], now)
        _wake_parent(run, now)
        return CancelOutcome.CANCELLED
    fault_point("workflows.cancel.not_waiting", run=run.pk)
    asked = WorkflowRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
        cancel_requested=True, updated_at=now
    )
    if asked:
        _cancel_dependents(run, now)
        return CancelOutcome.REQUESTED
    return CancelOutcome.ALREADY_FINISHED


def _cancel_dependents(run: WorkflowRun, now: datetime) -> None:
    """Cancel the run's unfinished children, its items' jobs, and mark its open
    checkpoints Cancelled."""
    for child in WorkflowRun.objects.filter(parent=run, status__in=RunStatus.unfinished()):
        _cancel(child, now)
    for item in WorkflowItem.objects.filter(step__run=run, status=StepStatus.RUNNING):
        job_store.cancel(run.scope_hash, item.job_id, now=now)
    WorkflowItem.objects.filter(step__run=run, status=StepStatus.RUNNING).update(
        status=StepStatus.CANCELLED, finished_at=now
    )
    WorkflowStep.objects.filter(
        run=run, status__in=(StepStatus.RUNNING, StepStatus.WAITING)
    ).update(status=StepStatus.CANCELLED, finished_at=now)


def resume(scope_hash: str, run_id: str) -> RunSnapshot:
    """FAILED -> WAITING: the failed checkpoints are erased (a failed child run is
    resumed too), so the replay runs them again with fresh retries; recorded
    checkpoints keep their values."""
    now = timezone.now()
    with transaction.atomic(using=alias()):
        run = _run_in_scope(scope_hash, run_id)
        if run.status == RunStatus.FAILED:
            refuse_hopeless_resume(run)
        _resume(run, now)
        run.refresh_from_db()
        return snapshot(run)


def _resume(run: WorkflowRun, now: datetime) -> None:
    resumed = WorkflowRun.objects.filter(pk=run.pk, status=RunStatus.FAILED).update(
        status=RunStatus.WAITING,
        generation=F("generation") + 1,
        cancel_requested=False,
        error="",
        failed_step="",
        output_json=None,
        waiting_for="resume",
        finished_at=None,
        updated_at=now,
    )
    if not resumed:
        raise InvalidTransition(f"run {run.run_id!r} is {run.status}: only a Failed run resumes")
    failed = WorkflowStep.objects.filter(run=run, status=StepStatus.FAILED)
    for step in failed.filter(kind=StepKind.CHILD).select_related("child"):
        if step.child is not None and step.child.status == RunStatus.FAILED:
            _resume(step.child, now)
            update_step(step, StepStatus.FAILED, status=StepStatus.WAITING, finished_at=None)
    # A failed try of an inline step, a failed map or activity, a timed-out wait: the
    # replay records them again. (Non-child failed steps only: a resumed child keeps
    # its checkpoint, now waiting.) Their keys are kept, so that the replay records
    # them again where they stood (see ``WorkflowRun.rerun_keys``).
    erased = WorkflowStep.objects.filter(run=run).filter(
        Q(status=StepStatus.FAILED) | Q(kind=StepKind.STEP, status=StepStatus.WAITING)
    )
    rerun_keys = list(erased.order_by("id").values_list("key", flat=True))
    erased.delete()
    WorkflowRun.objects.filter(pk=run.pk).update(rerun_keys=rerun_keys)
    generation = WorkflowRun.objects.filter(pk=run.pk).values_list("generation", flat=True)[0]
    wake(run.pk, generation, "resume", now=now)


# -- retention -----------------------------------------------------------------------


def purge_finished(*, older_than: datetime, limit: int | None = None) -> int:
    """Delete up to ``limit`` top-level runs that finished before ``older_than``, with
    their checkpoints, items, signals and children; returns how many runs."""
    limit = limit or workflows_settings().RETENTION_BATCH
    due = WorkflowRun.objects.finished_before(older_than).filter(parent__isnull=True)
    # The look outside a transaction: a pass with nothing to delete (the usual one)
    # takes no write lock (SQLite's IMMEDIATE transactions would).
    ids = list(due.order_by("finished_at").values_list("pk", flat=True)[:limit])
    if not ids:
        return 0
    with transaction.atomic(using=alias()):
        # Re-checked under the transaction: a run resumed meanwhile is not finished.
        ids = list(due.filter(pk__in=ids).values_list("pk", flat=True))
        drop_wakes(_with_descendants(ids), timezone.now())
        WorkflowRun.objects.filter(pk__in=ids).delete()
    return len(ids)


def _with_descendants(run_pks: list[int]) -> list[int]:
    """``run_pks`` and the ids of all their child runs, at any depth."""
    found, level = list(run_pks), list(run_pks)
    while level:
        level = list(WorkflowRun.objects.filter(parent__in=level).values_list("pk", flat=True))
        found += level
    return found


# -- reads ---------------------------------------------------------------------------


def _error_text(error_type: str, error: str) -> str:
    return f"{error_type}: {error}" if error_type else error


#: The kinds of checkpoint whose items a snapshot counts.
_WITH_ITEMS = (StepKind.MAP, StepKind.ACTIVITY)


def step_snapshot(
    step: WorkflowStep, child_run_id: str | None = None, counts: ItemCounts | None = None
) -> StepSnapshot:
    """``step`` as a snapshot; ``counts``: its items' counts if already read (a map's
    or an activity's are counted here otherwise)."""
    if counts is None and step.kind in _WITH_ITEMS:
        counts = item_counts(step)
    return StepSnapshot(
        key=step.key,
        kind=StepKind(step.kind),
        status=StepStatus(step.status),
        attempts=step.attempts,
        result=from_json(step.result_json),
        error=_error_text(step.error_type, step.error),
        started_at=step.started_at,
        finished_at=step.finished_at,
        wake_at=step.wake_at,
        items=counts,
        child_run_id=child_run_id,
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
            .select_related("child")
            .order_by("id")
            .defer("child__input_json", "child__output_json", "child__error")
        )
        counted: dict[int, dict[str, int]] = {}
        with_items = [step.pk for step in rows if step.kind in _WITH_ITEMS]
        if with_items:
            for step_id, status, n in (
                WorkflowItem.objects.filter(step_id__in=with_items)
                .values_list("step_id", "status")
                .annotate(n=Count("id"))
                .order_by()
            ):
                counted.setdefault(step_id, {})[status] = n
        for step in rows:
            counts = None
            if step.kind in _WITH_ITEMS:
                counts = _counts(step, counted.get(step.pk, {}))
            child_id = step.child.run_id if step.child is not None else None
            found[step.run_id].append(step_snapshot(step, child_id, counts))
    return {pk: tuple(steps) for pk, steps in found.items()}


def _counts(step: WorkflowStep, by_status: dict[str, int]) -> ItemCounts:
    return ItemCounts(
        total=step.item_count,
        succeeded=by_status.get(StepStatus.SUCCEEDED, 0),
        failed=by_status.get(StepStatus.FAILED, 0),
        running=by_status.get(StepStatus.RUNNING, 0),
        cancelled=by_status.get(StepStatus.CANCELLED, 0),
    )


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
    waiting_for = run.waiting_for
    if run.status == RunStatus.WAITING and waiting_for.endswith(" items"):
        # Items end without waking the run: count them now. Only a run that waits for
        # its items says so; a run waiting for a signal says that, whatever other
        # checkpoint still has items out.
        for step in steps:
            if step.items is not None and step.status == StepStatus.RUNNING:
                ended = step.items.total - step.items.running
                waiting_for = f"{ended} of {step.items.total} items"
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
        waiting_for=waiting_for,
        created_at=run.created_at,
        finished_at=run.finished_at,
        cancel_requested=run.cancel_requested,
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
) -> list[RunSnapshot]:
    """The scope's runs, oldest first, with their checkpoints: three queries (the
    runs with their parents, the checkpoints, the items' counts), not one per run."""
    rows = WorkflowRun.objects.for_scope(scope_hash).order_by("created_at", "id")
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


def child_run(step: WorkflowStep) -> WorkflowRun | None:
    """The child run a child checkpoint waits for, read fresh."""
    return WorkflowRun.objects.filter(pk=step.child_id).first() if step.child_id else None
