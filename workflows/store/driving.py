"""Driving a run: a worker takes it for one advance under a new token, fences every
write with that token, and ends the advance by suspending or finishing the run;
a run whose advance job failed for good is released to a new one."""

from __future__ import annotations

import enum
import json
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, OuterRef, Subquery

from jobs.models import Job
from jobs.types import FINISHED_STATUSES, JobStatus
from ledon.db import UNFLUSHED_COMMIT, adapt_dt, is_postgres, read_dt
from ledon.errors import storable_text
from ledon.faults import fault_point

from ..models import WorkflowRun, WorkflowSignal, WorkflowStep
from ..types import DrivenRun, RunStatus, Wait, WaitKind
from .base import Driver, StaleDriver, alias, current_time, ended, let_go
from .checkpoints import RecordedSteps, load_steps, recorded_steps, step_reads
from .control import cancel_dependents
from .waking import advance_scope_hash, drop_wakes, wake, wake_parent


def take(run_pk: int, job_id: str | None = None, *, now: datetime | None = None) -> Driver | None:
    """Take the run for one advance -> RUNNING with a new driver token.

    From WAITING; or from RUNNING when ``job_id`` is the advance job that took it last
    (that job's worker was killed, or its advance failed on an outage, and the job
    runs again), or when no job is named (an operator's or a test's direct call).
    Another job that finds the run RUNNING does not take it over — it would run the
    current step a second time beside the live driver — but leaves a wake-up for
    that driver, which then replays once more before it waits. None if the run was
    not taken.

    One statement decides and writes both outcomes under the row's lock, so a driver
    that suspends the run meanwhile is ordered before or after the whole decision: a
    wake-up it refuses is never lost to a run that went Waiting in between. The run
    comes back from the same statement.
    """
    taken = _take(run_pk, job_id, now, with_steps=False)
    return None if taken is None else taken.driver


@dataclass(frozen=True, slots=True)
class Taken:
    """A take (:func:`take_with_steps`): the driver, the run's recorded checkpoints,
    and the signal the run waited for as the same statement read it."""

    driver: Driver
    steps: RecordedSteps
    #: The signal the run waited for when it was taken, read with the run's cancel
    #: flag (None: the run waited for no signal).
    signal: SignalAtTake | None


@dataclass(frozen=True, slots=True)
class SignalAtTake:
    """The signal a run waited for, and its cancel flag, as its take read them: what
    the wait for that signal reads first, one round trip fewer from a signal's send
    to the step after its wait. Read before the body runs, it is no older than a read
    at the wait: a signal sent after it finds the run Running and leaves a wake-up
    (the driver replays once more), and a cancel after it is read again at the next
    checkpoint with work to do."""

    key: str
    #: The signal's payload (JSON text), None if it was not sent yet.
    payload_json: str | None
    cancelled: bool


def take_with_steps(
    run_pk: int, job_id: str | None = None, *, now: datetime | None = None
) -> Taken | None:
    """:func:`take`, and the run's recorded checkpoints read right after it (as
    :func:`~workflows.store.load_steps` reads them): on PostgreSQL the statements go
    in one pipeline, one round trip (the reads are wasted on a run not taken). The
    take also reads the signal the run waited for (:class:`SignalAtTake`)."""
    return _take(run_pk, job_id, now, with_steps=True)


def _take(
    run_pk: int, job_id: str | None, now: datetime | None, *, with_steps: bool
) -> Taken | None:
    """The take of :func:`take` and :func:`take_with_steps`."""
    connection = transaction.get_connection(alias())
    token = uuid.uuid4().hex
    sql, params = _take_statement(connection, run_pk, token, job_id, current_time(now))
    if not with_steps or not is_postgres(connection):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        driver = _taken(run_pk, token, row)
        if driver is None:
            return None
        steps = load_steps(run_pk) if with_steps else RecordedSteps()
        return Taken(driver, steps, _signal_at_take(row))
    reads = step_reads(connection, run_pk)
    connection.ensure_connection()
    raw = connection.connection
    started = time.monotonic()
    with connection.wrap_database_errors, ExitStack() as cursors:
        taking = cursors.enter_context(raw.cursor())
        reading = [cursors.enter_context(raw.cursor()) for _ in reads]
        with raw.pipeline():
            taking.execute(sql, params)
            for cursor, (read, read_params) in zip(reading, reads, strict=True):
                cursor.execute(read, read_params)
        row = taking.fetchone()
        driver = _taken(run_pk, token, row)
        rows = [cursor.fetchall() for cursor in reading]
    if connection.queries_logged:  # where Django's own cursors record theirs
        took = f"{time.monotonic() - started:.3f}"
        sent = "; ".join([sql, *(read for read, _ in reads)])
        connection.queries_log.append({"sql": sent, "time": took})
    if driver is None:
        return None
    return Taken(driver, recorded_steps(connection, *rows), _signal_at_take(row))


def _take_statement(
    connection: BaseDatabaseWrapper, run_pk: int, token: str, job_id: str | None, now: datetime
) -> tuple[str, list[Any]]:
    """The statement of :func:`take` and its parameters."""
    q = connection.ops.quote_name
    takeable = f"({q('status')} = %s OR ({q('status')} = %s"
    takeable_params: list[Any] = [RunStatus.WAITING, RunStatus.RUNNING]
    if job_id is not None:
        takeable += f" AND {q('driver_job')} = %s"
        takeable_params.append(job_id)
    takeable += "))"
    # Each column: what a take writes, else what it keeps (a refused take leaves a
    # wake-up on a Running run); the set's expressions all read the row as it was.
    columns: list[tuple[str, str, list[Any], str, list[Any]]] = [
        ("status", "%s", [RunStatus.RUNNING], q("status"), []),
        ("driver_token", "%s", [token], q("driver_token"), []),
        ("driver_job", "%s", [job_id], q("driver_job"), []),
        ("wake_pending", "%s", [False], f"({q('wake_pending')} OR {q('status')} = %s)",
         [RunStatus.RUNNING]),
        ("advances", f"{q('advances')} + 1", [], q("advances"), []),
        ("updated_at", "%s", [adapt_dt(connection, now)], q("updated_at"), []),
    ]  # fmt: skip
    sets: list[str] = []
    params: list[Any] = []
    for column, taken, taken_params, kept, kept_params in columns:
        sets.append(f"{q(column)} = CASE WHEN {takeable} THEN {taken} ELSE {kept} END")
        params += [*takeable_params, *taken_params, *kept_params]
    returned = ", ".join(q(column) for column in _TAKEN)
    # The signal the run waits for, with its cancel flag (see SignalAtTake).
    runs, signals = q(WorkflowRun._meta.db_table), q(WorkflowSignal._meta.db_table)
    waited = f"CASE WHEN {q('wait_kind')} = %s THEN {q('wait_key')} END"
    payload = (
        f"CASE WHEN {q('wait_kind')} = %s THEN (SELECT {signals}.{q('payload_json')}"
        f" FROM {signals} WHERE {signals}.{q('run_id')} = {runs}.{q('id')}"
        f" AND {signals}.{q('key')} = {runs}.{q('wait_key')}) END"
    )
    returned += f", {q('cancel_requested')}, {waited}, {payload}"
    # In autocommit on PostgreSQL the take commits without waiting for the disk: a
    # crash of the server that took it back would leave the run as it stood before,
    # and the advance job, whose claim committed durably before it, takes it again.
    unflushed = (
        f" FROM ({UNFLUSHED_COMMIT}) AS unflushed"
        if is_postgres(connection) and connection.get_autocommit()
        else ""
    )
    sql = (
        f"UPDATE {runs} SET {', '.join(sets)}{unflushed}"
        f" WHERE {q('id')} = %s RETURNING {q('driver_token')} = %s, {returned}"
    )
    return sql, [*params, run_pk, token, WaitKind.SIGNAL, WaitKind.SIGNAL]


def _taken(run_pk: int, token: str, row: Sequence[Any] | None) -> Driver | None:
    """The driver of a take that returned ``row`` (None: not taken)."""
    if row is None or not row[0]:
        fault_point("workflows.take.refused", run=run_pk)
        return None
    run = dict(zip(_TAKEN, row[1 : 1 + len(_TAKEN)], strict=True))
    run["pk"] = run.pop("id")
    run["rerun_keys"] = tuple(_json_list(run["rerun_keys"]))
    if run["deadline"] is not None:
        run["deadline"] = read_dt(run["deadline"])
    return Driver(DrivenRun(**run), token)


def _signal_at_take(row: Sequence[Any]) -> SignalAtTake | None:
    """The signal a take's ``row`` read (None: the run waited for no signal)."""
    cancelled, key, payload_json = row[1 + len(_TAKEN) :]
    return None if key is None else SignalAtTake(key, payload_json, bool(cancelled))


def give_back(driver: Driver, now: datetime) -> bool:
    """RUNNING (this driver) -> WAITING as the run stood before this driver took it
    (no driver, one advance fewer, what it waits for untouched): the advance found no
    definition of the run's version here, and leaves the run to a worker that has
    one. A wake-up left meanwhile stages an advance job, so none is lost. False if
    the driver is stale."""
    with transaction.atomic(using=alias()):
        woken = driver.held().filter(wake_pending=True).exists()
        given = driver.held().update(
            status=RunStatus.WAITING,
            driver_token=None,
            driver_job=None,
            wake_pending=False,
            advances=F("advances") - 1,
            updated_at=now,
        )
        if given and woken:
            run = driver.run
            wake(run.pk, run.generation, "released", driver.token, now=now)
    return bool(given)


#: The columns of a run that its driver reads as it takes it (:class:`DrivenRun`'s).
_TAKEN = tuple("id" if name == "pk" else name for name in DrivenRun.__dataclass_fields__)


def _json_list(value: Any) -> list[Any]:
    """A JSON list column read by raw SQL (text on SQLite, and from Django's
    PostgreSQL connections)."""
    return list(json.loads(value) if isinstance(value, str | bytes) else value)


def guard(driver: Driver, now: datetime) -> None:
    """The fence: touch the run row only if this driver still holds it. On PostgreSQL
    the row stays locked until the transaction ends, which orders this transaction
    with signal senders and cancels."""
    held = driver.held().update(updated_at=now)
    if not held:
        raise StaleDriver(f"run {driver.run.run_id!r}: another driver holds it")


def cancel_requested(run_pk: int) -> bool:
    """Whether run ``run_pk``'s cancel was requested: read at every checkpoint with
    work to do, so one plain statement."""
    connection = transaction.get_connection(alias())
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {q('cancel_requested')} FROM {q(WorkflowRun._meta.db_table)}"
            f" WHERE {q('id')} = %s",
            [run_pk],
        )
        row = cursor.fetchone()
    return row is not None and bool(row[0])


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


def suspend(driver: Driver, wait: Wait, now: datetime) -> Suspended:
    """RUNNING (this driver, no wake-up pending, no cancel requested) -> WAITING: the
    advance ends without holding a slot. A wake-up left meanwhile (a signal, the last
    item, a child's end, another advance job) makes the driver replay instead, so none
    is lost; a cancel requested meanwhile makes it end the run, so that no run waits
    with a cancel nobody will act on."""
    held = driver.held()
    with transaction.atomic(using=alias()):
        if held.filter(wake_pending=False, cancel_requested=False).update(
            **let_go(RunStatus.WAITING, wait, now)
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
            **ended(status, now),
            output_json=output_json,
            error=storable_text(error),
            failed_step=failed_step,
        )
        if not done:
            return False
        if status is RunStatus.CANCELLED:
            cancel_dependents(driver.run.pk, driver.run.scope_hash, now)
        drop_wakes([driver.run.pk], now)
        wake_parent(driver.run.parent_id, driver.run.parent_key, now)
    return True


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
        ).update(**let_go(RunStatus.WAITING, Wait(kind=WaitKind.ADVANCE), now), wake_pending=False)
        if released:
            wake(run.pk, run.generation, "released", f"{job_id}@{run.advances}", now=now)
        return bool(released)


@dataclass(frozen=True, slots=True, kw_only=True)
class EndedHold:
    """A run still Running under an advance job that ended for good: the hold of the
    job's last driver on it (:attr:`driver`, its token the run's), and how the job
    ended."""

    driver: Driver
    job_id: str
    job_status: JobStatus
    #: The job ended Interrupted at the crash budget: its worker kept dying.
    keeps_killing_worker: bool
    #: The job's attempts its worker died in.
    interruptions: int
    #: The key of the run's last recorded checkpoint (None: it recorded none).
    last_key: str | None


def holds_of_ended_jobs(*, limit: int, job_id: str | None = None) -> list[EndedHold]:
    """Up to ``limit`` runs still Running under an advance job that has ended for
    good, each as :class:`EndedHold`: the job ended Interrupted after its worker kept
    dying (recovered by another process, which sends no ``attempt_finished``), its
    tries failed on an outage, it was cancelled, or its worker was killed between the
    job's end and the signal of it. Nothing else would ever take such a run.
    ``job_id``: only the run that advance job holds (the word of its end came)."""
    ended_job = Job.objects.filter(
        scope_hash=advance_scope_hash(), job_id=OuterRef("driver_job"), status__in=FINISHED_STATUSES
    )
    held = WorkflowRun.objects.filter(status=RunStatus.RUNNING, driver_job__isnull=False)
    if job_id is not None:
        held = held.filter(driver_job=job_id)
    rows = (
        held.annotate(
            job_status=Subquery(ended_job.values("status")[:1]),
            job_keeps_killing=Subquery(ended_job.values("keeps_killing_worker")[:1]),
            job_interruptions=Subquery(ended_job.values("interruption_count")[:1]),
        )
        .filter(job_status__isnull=False)
        .order_by("pk")
        .values_list(
            *_TAKEN,
            "driver_token",
            "driver_job",
            "job_status",
            "job_keeps_killing",
            "job_interruptions",
        )[:limit]
    )
    holds = []
    for row in rows:
        run = dict(zip(_TAKEN, row[: len(_TAKEN)], strict=True))
        run["pk"] = run.pop("id")
        run["rerun_keys"] = tuple(run["rerun_keys"])
        token, held_by, job_status, keeps_killing, interruptions = row[len(_TAKEN) :]
        last_key = (
            WorkflowStep.objects.filter(run_id=run["pk"])
            .order_by("-pk")
            .values_list("key", flat=True)
            .first()
        )
        holds.append(
            EndedHold(
                driver=Driver(DrivenRun(**run), token),
                job_id=held_by,
                job_status=JobStatus(job_status),
                keeps_killing_worker=bool(keeps_killing),
                interruptions=interruptions,
                last_key=last_key,
            )
        )
    return holds
