"""Checkpoints: a run's recorded steps, read at every replay, written and moved on
inside the driver's fenced transaction, or by one statement that carries its own
fence (:func:`record_step`)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import fields as fields_of
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import UNFLUSHED_COMMIT, adapt_dt, is_postgres, read_dt
from ledon.values import from_row

from ..models import WorkflowRun, WorkflowStep
from ..types import Checkpoint, RunStatus, StepKind, StepStatus
from .base import Driver, alias

#: What a checkpoint holds: the columns a replay reads, a move writes back.
_FIELDS = tuple(field.name for field in fields_of(Checkpoint))
#: The fields read of a Succeeded inline step: the first, up to its result.
_SHORT = _FIELDS[: _FIELDS.index("result_json") + 1]
_STEPS = WorkflowStep._meta.db_table
_RUNS = WorkflowRun._meta.db_table
#: The column of each field of a checkpoint's row.
_COLUMNS: dict[str, str] = {
    field.attname: field.column or field.attname for field in WorkflowStep._meta.concrete_fields
}


class RecordedSteps:
    """A run's recorded checkpoints by key, in the order recorded, as one read gave
    them: plain rows, each made a :class:`~workflows.types.Checkpoint` the first time
    it is asked for. A replay of a long run passes most of them by
    :meth:`result_of`, which makes none.

    A Succeeded inline step's row may hold only the fields up to its result (see
    :func:`step_reads`); asked for whole, it is read whole then."""

    __slots__ = ("_made", "_rows")

    def __init__(self, rows: dict[str, Sequence[Any]] | None = None) -> None:
        self._rows: dict[str, Sequence[Any]] = {} if rows is None else rows
        self._made: dict[str, Checkpoint] = {}

    def get(self, key: str) -> Checkpoint | None:
        """Checkpoint ``key`` as it stands (None if there is none)."""
        step = self._made.get(key)
        if step is None:
            row = self._rows.get(key)
            if row is not None and len(row) < len(_FIELDS):
                row = _whole_row(row[0])
            if row is None:
                return None
            step = self._made[key] = _checkpoint(row)
        return step

    def put(self, step: Checkpoint) -> None:
        """Keep ``step`` as the picture of its key (recorded by this advance)."""
        self._made[step.key] = step

    def result_of(self, key: str, kind: StepKind) -> str | None:
        """The recorded result (JSON text) of checkpoint ``key`` if it is a Succeeded
        one of ``kind`` as read, never asked for nor put since; else None."""
        if key in self._made:
            return None
        row = self._rows.get(key)
        if row is None or row[_KIND] != kind or row[_STATUS] != StepStatus.SUCCEEDED:
            return None
        result: str | None = row[_RESULT]
        return result

    def keys(self, *, without: StepKind) -> Iterator[str]:
        """The keys as read, in the order recorded, but those of kind ``without``."""
        return (key for key, row in self._rows.items() if row[_KIND] != without)


#: Where a row of :data:`_FIELDS` holds its kind, status and result.
_KIND, _STATUS, _RESULT = (_FIELDS.index(name) for name in ("kind", "status", "result_json"))


def load_steps(run_pk: int) -> RecordedSteps:
    """The recorded checkpoints of run ``run_pk``, read at the start of every advance
    (thousands for a long run: plain tuples, see :func:`step_reads`)."""
    connection = transaction.get_connection(alias())
    read = []
    with connection.cursor() as cursor:
        for sql, params in step_reads(connection, run_pk):
            cursor.execute(sql, params)
            read.append(cursor.fetchall())
    return recorded_steps(connection, *read)


def step_reads(connection: BaseDatabaseWrapper, run_pk: int) -> list[tuple[str, list[Any]]]:
    """The statements of :func:`load_steps` and their parameters: the fields up to
    its result of every checkpoint of run ``run_pk``, in the order recorded; then
    every field of those that are no Succeeded inline step (a long run's few). A
    Succeeded inline step is replayed by its key and result alone, and a read of
    10,000 of them costs a third less without the rest (their error text, times,
    counts)."""
    q = connection.ops.quote_name
    run = f"FROM {q(_STEPS)} WHERE {q('run_id')} = %s"
    short, whole = _columns(connection, _SHORT), _columns(connection, _FIELDS)
    passed = f"{q('kind')} = %s AND {q('status')} = %s"
    return [
        (f"SELECT {short} {run} ORDER BY {q('id')}", [run_pk]),
        (f"SELECT {whole} {run} AND NOT ({passed})", [run_pk, StepKind.STEP, StepStatus.SUCCEEDED]),
    ]


def recorded_steps(
    connection: BaseDatabaseWrapper, rows: list[Any], whole: list[Any]
) -> RecordedSteps:
    """The rows :func:`step_reads` read, by key: each checkpoint's whole row where
    the second read gave it, else its first fields."""
    by_key = {row[1]: row for row in rows}
    for row in whole:
        by_key[row[1]] = row if connection.vendor == "postgresql" else _read(row)
    return RecordedSteps(by_key)


def _whole_row(pk: int) -> Sequence[Any] | None:
    """Every field of checkpoint ``pk`` (None if it is gone)."""
    connection = transaction.get_connection(alias())
    q = connection.ops.quote_name
    whole = _columns(connection, _FIELDS)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {whole} FROM {q(_STEPS)} WHERE {q('id')} = %s", [pk])
        row: Sequence[Any] | None = cursor.fetchone()
    if row is None or connection.vendor == "postgresql":
        return row
    return _read(row)


def _columns(connection: BaseDatabaseWrapper, names: Sequence[str]) -> str:
    """The quoted columns of checkpoint fields ``names``, for a SELECT."""
    q = connection.ops.quote_name
    return ", ".join(q(_COLUMNS["id" if name == "pk" else name]) for name in names)


def load_steps_of(run_pks: list[int]) -> dict[int, RecordedSteps]:
    """:func:`load_steps` for several runs in one query (a run with none is
    missing)."""
    rows = (
        WorkflowStep.objects.filter(run_id__in=run_pks)
        .order_by("id")
        .values_list("run_id", *_FIELDS)
    )
    runs: dict[int, dict[str, Sequence[Any]]] = {}
    for run_pk, *fields in rows:
        runs.setdefault(run_pk, {})[fields[1]] = fields
    return {run_pk: RecordedSteps(steps) for run_pk, steps in runs.items()}


#: Where a row of :data:`_FIELDS` holds its wake time (text in a raw read on SQLite).
_WAKE_AT = _FIELDS.index("wake_at")


def _read(row: Sequence[Any]) -> Sequence[Any]:
    """A raw row read on SQLite, its wake time made a datetime."""
    if row[_WAKE_AT] is None:
        return row
    return (*row[:_WAKE_AT], read_dt(row[_WAKE_AT]), *row[_WAKE_AT + 1 :])


def _checkpoint(row: Sequence[Any]) -> Checkpoint:
    pk, key, kind, status, attempts, result, error_type, error, wake_at, count, child = row
    return Checkpoint(
        pk=pk,
        key=key,
        kind=StepKind(kind),
        status=StepStatus(status),
        attempts=attempts,
        result_json=result,
        error_type=error_type,
        error=error,
        wake_at=wake_at,
        item_count=count,
        child_id=child,
    )


def insert_step(
    driver: Driver,
    key: str,
    kind: StepKind,
    status: StepStatus,
    now: datetime,
    **fields: Any,
) -> Checkpoint:
    """Record a new checkpoint (inside a transaction :func:`guard` fenced). The unique
    (run, key) makes a second recording of one key impossible whatever races."""
    step = WorkflowStep.objects.create(
        run_id=driver.run.pk,
        key=key,
        kind=kind,
        status=status,
        started_at=now,
        finished_at=now if status.is_finished else None,
        **fields,
    )
    return from_row(Checkpoint, step, kind=kind, status=status)


def update_step(step: Checkpoint, expected: StepStatus, **fields: Any) -> Checkpoint | None:
    """Move a checkpoint from ``expected`` (inside a fenced transaction): the
    checkpoint as it now stands, or None if it was not there any more (nothing
    written)."""
    if not WorkflowStep.objects.filter(pk=step.pk, status=expected).update(**fields):
        return None
    return replace(step, **{name: value for name, value in fields.items() if name in _FIELDS})


def record_step(
    driver: Driver,
    step: Checkpoint | None,
    key: str,
    kind: StepKind,
    status: StepStatus,
    now: datetime,
    *,
    flushed: bool = True,
    **fields: Any,
) -> Checkpoint | None:
    """Record checkpoint ``key`` as ``status`` — a new one, or ``step`` moved on from
    where it stands — fenced by the driver's token: one statement on PostgreSQL (the
    fence's touch of the run row and the checkpoint's write, the row locked until the
    transaction ends, as :func:`~workflows.store.guard` locks it), the two under one
    transaction on SQLite. Alone, it is its own transaction; inside the caller's, it
    joins it. None (nothing written) if the driver is stale, or ``step`` is not where
    it stood.

    ``flushed=False``: the checkpoint's value is read from rows already durable (a
    signal's payload, a timer's due time), so alone on PostgreSQL it commits without
    waiting for the disk (:data:`ledon.db.UNFLUSHED_COMMIT`): a crash of the server
    that took it back leaves the next replay to read the same value again. A step's
    result, which only its run holds, is always flushed."""
    finished_at = now if status.is_finished else None
    if step is None:
        values = {**_NEW, **fields, "kind": kind, "status": status}
        values.update(started_at=now, finished_at=finished_at)
    else:
        values = {**fields, "status": status, "finished_at": finished_at}
    connection = transaction.get_connection(alias())
    if not is_postgres(connection):
        with transaction.atomic(using=connection.alias, savepoint=False):
            if not driver.held().update(updated_at=now):
                return None
            if step is None:
                return insert_step(driver, key, kind, status, now, **fields)
            return update_step(step, step.status, **values)
    names = tuple(values)
    params: list[Any] = [adapt_dt(connection, now), driver.run.pk, driver.token, RunStatus.RUNNING]
    if step is None:
        params.append(key)
    params += [_adapted(connection, name, values[name]) for name in names]
    if step is not None:
        params += [step.pk, step.status]
    unflushed = not flushed and connection.get_autocommit()
    sql = _fenced_write(names, new=step is None, unflushed=unflushed)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    if step is None:
        return Checkpoint(pk=row[0], key=key, **{**_NEW_CHECKPOINT, **_picked(values)})
    return replace(step, **_picked(values))


#: What a new checkpoint holds unless its write says otherwise: the model's defaults
#: of every column its write does not always set.
_NEW: dict[str, Any] = {
    field.attname: field.get_default()
    for field in WorkflowStep._meta.concrete_fields
    if field.attname not in {"id", "run_id", "key", "kind", "status", "started_at", "finished_at"}
}
_NEW_CHECKPOINT = {name: value for name, value in _NEW.items() if name in _FIELDS}


@functools.lru_cache(maxsize=64)
def _fenced_write(names: tuple[str, ...], *, new: bool, unflushed: bool = False) -> str:
    """The PostgreSQL statement of :func:`record_step` that sets the fields ``names``
    of a ``new`` checkpoint (an insert) or of a recorded one (an update). Its
    parameters: the fence's (the time, the run, the token, the Running status), then
    the key of a new checkpoint, the fields' values, and a recorded checkpoint's id
    and status. ``unflushed``: the statement commits without waiting for the disk
    (alone in autocommit, see :func:`record_step`)."""
    q = connections[alias()].ops.quote_name
    steps = q(_STEPS)
    columns = [q(_COLUMNS[name]) for name in names]
    if new:
        write = (
            f"INSERT INTO {steps} ({q('run_id')}, {q('key')}, {', '.join(columns)})"
            f" SELECT fence.id, %s, {', '.join('%s' for _ in columns)}"
            f" FROM fence RETURNING {q('id')}"
        )
    else:
        write = (
            f"UPDATE {steps} SET {', '.join(f'{column} = %s' for column in columns)}"
            f" FROM fence WHERE {steps}.{q('id')} = %s AND {q('status')} = %s"
            f" AND {steps}.{q('run_id')} = fence.id RETURNING {steps}.{q('id')}"
        )
    return (
        f"WITH fence AS (UPDATE {q(_RUNS)} SET {q('updated_at')} = %s"
        + (f" FROM ({UNFLUSHED_COMMIT}) AS unflushed" if unflushed else "")
        + f" WHERE {q('id')} = %s"
        f" AND {q('driver_token')} = %s AND {q('status')} = %s RETURNING {q('id')}) {write}"
    )


def _picked(values: dict[str, Any]) -> dict[str, Any]:
    """The fields of a checkpoint among a write's ``values``."""
    return {name: value for name, value in values.items() if name in _FIELDS}


def _adapted(connection: BaseDatabaseWrapper, name: str, value: Any) -> Any:
    """A value of field ``name`` as a raw statement passes it."""
    if isinstance(value, datetime):
        return adapt_dt(connection, value)
    return value
