"""Signals: a signal recorded for a run, kept until its wait reads it, waking the run
if it waits for it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from ledon.db import adapt_dt, is_postgres
from ledon.faults import fault_point
from ledon.values import from_row

from ..exceptions import RunNotFound, SignalConflict
from ..models import WorkflowRun, WorkflowSignal
from ..types import RunStatus, SignalOutcome, WaitKind
from ..validation import from_json
from .base import alias, current_time, run_in_scope
from .waking import wake


def send_signal(scope_hash: str, run_id: str, key: str, payload_json: str) -> SignalOutcome:
    """Record a signal for a run and wake the run unless it waits for something else.

    Works in its own transaction or inside the caller's (then it is delivered only if
    that commits). The run row is locked first, so a driver that is about to wait for
    this key either sees the signal or is woken by it.
    """
    now = current_time()
    with transaction.atomic(using=alias()):
        run, kept = _lock_and_keep(scope_hash, run_id, key, payload_json, now)
        if run.status in RunStatus.finished():
            existing = _sent(run.pk, key)
            if existing is None:
                return SignalOutcome.RUN_FINISHED
            return _already_sent(existing, payload_json, key, run_id)
        if not kept:
            return _already_sent(_sent(run.pk, key), payload_json, key, run_id)
        fault_point("workflows.signal.deliver", run=run.pk, key=key)
        if run.status == RunStatus.RUNNING:
            # The driver replays once more before it waits (see suspend).
            WorkflowRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
                wake_pending=True
            )
        elif run.wait_kind == WaitKind.SIGNAL and run.wait_key == key:
            wake(run.pk, run.generation, "signal", key, now=now)
        # Waiting for anything else (its first advance, a timer, items…): the run
        # reads the kept signal when its body reaches the wait.
    return SignalOutcome.DELIVERED


@dataclass(frozen=True, slots=True)
class _Signalled:
    """What a signal's sender reads of its run (its row locked)."""

    pk: int
    status: str
    wait_kind: str
    wait_key: str
    generation: int


def _lock_and_keep(
    scope_hash: str, run_id: str, key: str, payload_json: str, now: datetime
) -> tuple[_Signalled, bool]:
    """Lock run ``run_id`` of the scope as it is read (as an update of its row locks
    it: this transaction is ordered with the driver's fenced writes) and, unless it
    has finished, keep signal ``key`` for it; whether it was kept (False: one was
    sent under that key already, nothing written). :class:`RunNotFound` if there is
    no such run. One statement on PostgreSQL; the lock, then the insert, on SQLite
    (whose transaction holds the one write lock)."""
    connection = transaction.get_connection(alias())
    if not is_postgres(connection):
        found = run_in_scope(scope_hash, run_id, lock=True)
        run = from_row(_Signalled, found, pk=found.pk)
        finished = run.status in RunStatus.finished()
        return run, not finished and _record(run.pk, key, payload_json, now)
    q = connection.ops.quote_name
    signals = q(WorkflowSignal._meta.db_table)
    columns = ", ".join(q(name) for name in _SIGNALLED[1:])
    ended = ", ".join("%s" for _ in RunStatus.finished())
    sql = (
        f"WITH run AS (SELECT {q('id')}, {columns} FROM {q(WorkflowRun._meta.db_table)}"
        f" WHERE {q('scope_hash')} = %s AND {q('run_id')} = %s FOR NO KEY UPDATE),"
        f" kept AS (INSERT INTO {signals}"
        f" ({q('run_id')}, {q('key')}, {q('payload_json')}, {q('created_at')})"
        f" SELECT {q('id')}, %s, %s, %s FROM run WHERE {q('status')} NOT IN ({ended})"
        f" ON CONFLICT ({q('run_id')}, {q('key')}) DO NOTHING RETURNING {q('id')})"
        f" SELECT {q('id')}, {columns}, EXISTS (SELECT 1 FROM kept) FROM run"
    )
    params = [scope_hash, run_id, key, payload_json, adapt_dt(connection, now)]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *RunStatus.finished()])
        row = cursor.fetchone()
    if row is None:
        raise RunNotFound(f"no run {run_id!r} in this scope")
    return _Signalled(*row[:-1]), bool(row[-1])


#: The columns of :class:`_Signalled`.
_SIGNALLED = ("id", "status", "wait_kind", "wait_key", "generation")


def _record(run_pk: int, key: str, payload_json: str, now: datetime) -> bool:
    """Keep signal ``key`` for run ``run_pk``: False (nothing written) if one was
    sent under that key already. One statement, which yields to the unique (run, key)
    without breaking the caller's transaction."""
    connection = transaction.get_connection(alias())
    q = connection.ops.quote_name
    sql = (
        f"INSERT INTO {q(WorkflowSignal._meta.db_table)}"
        f" ({q('run_id')}, {q('key')}, {q('payload_json')}, {q('created_at')})"
        f" VALUES (%s, %s, %s, %s) ON CONFLICT ({q('run_id')}, {q('key')}) DO NOTHING"
        f" RETURNING {q('id')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_pk, key, payload_json, adapt_dt(connection, now)])
        return cursor.fetchone() is not None


def _sent(run_pk: int, key: str) -> str | None:
    """The payload of the signal ``key`` kept for run ``run_pk``, if any."""
    return (
        WorkflowSignal.objects.filter(run_id=run_pk, key=key)
        .values_list("payload_json", flat=True)
        .first()
    )


def _already_sent(existing: str | None, payload_json: str, key: str, run_id: str) -> SignalOutcome:
    """A signal sent again: the same payload changes nothing, another one is
    :class:`SignalConflict`."""
    if existing != payload_json:
        raise SignalConflict(
            f"signal {key!r} was already sent to run {run_id!r} with another payload"
        )
    return SignalOutcome.ALREADY_SENT


def cancel_and_signal(run_pk: int, key: str) -> tuple[bool, tuple[bool, Any]]:
    """Whether run ``run_pk``'s cancel was requested, and :func:`signal_payload` of
    signal ``key``: one plain statement, for the wait that reads both at once (on
    the path from a signal's send to the step after its wait)."""
    connection = transaction.get_connection(alias())
    with connection.cursor() as cursor:
        cursor.execute(_cancel_and_signal_query(connection.vendor), [key, run_pk])
        row = cursor.fetchone()
    if row is None:
        return False, (False, None)
    cancelled, payload = row
    return bool(cancelled), (payload is not None, from_json(payload))


@functools.cache
def _cancel_and_signal_query(vendor: str) -> str:
    """The statement of :func:`cancel_and_signal` (its parameters: the key, the
    run), built once per database vendor."""
    q = connections[alias()].ops.quote_name
    signals, runs = q(WorkflowSignal._meta.db_table), q(WorkflowRun._meta.db_table)
    return (
        f"SELECT {runs}.{q('cancel_requested')}, (SELECT {q('payload_json')} FROM {signals}"
        f" WHERE {signals}.{q('run_id')} = {runs}.{q('id')} AND {signals}.{q('key')} = %s)"
        f" FROM {runs} WHERE {runs}.{q('id')} = %s"
    )


def signal_payload(run_pk: int, key: str) -> tuple[bool, Any]:
    """Whether signal ``key`` was sent to run ``run_pk``, and its payload."""
    payload = (
        WorkflowSignal.objects.filter(run_id=run_pk, key=key)
        .values_list("payload_json", flat=True)
        .first()
    )
    return (payload is not None, from_json(payload))
