"""What every module of the store shares: its database, its clock (``ledon.clock``'s
rule), the run row's lock, the lookup of a run in a scope, and a driver's hold on a
run (the fence of its writes)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from ledon import clock
from ledon.db import UNFLUSHED_COMMIT, alias_for, is_postgres

from ..exceptions import InvalidInput, RunNotFound
from ..models import WorkflowRun
from ..types import DrivenRun, RunStatus, Wait


def current_time(now: datetime | None = None) -> datetime:
    """The time a transition is recorded at: ``now`` (an aware datetime, in UTC) or,
    when None, the current time (the rule of every app's store)."""
    return clock.current_time(now, error=InvalidInput)


def alias() -> str:
    return alias_for(WorkflowRun)


def commit_unflushed() -> None:
    """PostgreSQL, inside the caller's transaction: it commits without waiting for its
    WAL to reach the disk (:data:`ledon.db.UNFLUSHED_COMMIT`), for a transaction whose
    loss in a crash of the server harms nothing (what it wrote is read again from rows
    already durable, and any later durable commit flushes it first). SQLite: nothing."""
    connection = transaction.get_connection(alias())
    if is_postgres(connection):
        with connection.cursor() as cursor:
            cursor.execute(UNFLUSHED_COMMIT)


def run_in_scope(scope_hash: str, run_id: str, *, lock: bool = False) -> WorkflowRun:
    """Run ``run_id`` of scope ``scope_hash`` (its row locked with ``lock`` until the
    transaction ends, as an update of the row locks it: a driver's fenced writes wait
    for it), or :class:`RunNotFound`."""
    rows = WorkflowRun.objects.for_scope(scope_hash).filter(run_id=run_id)
    if lock:
        rows = rows.select_for_update(no_key=True)
    run = rows.first()
    if run is None:
        raise RunNotFound(f"no run {run_id!r} in this scope")
    return run


def let_go(status: RunStatus, wait: Wait | None, now: datetime) -> dict[str, Any]:
    """What a run's row is set to as it is let go (it waits, or ends): ``status``, no
    driver, and what it waits for (``wait``; None: nothing, and no wake time)."""
    return {
        "status": status,
        "driver_token": None,
        "driver_job": None,
        "wait_kind": wait.kind if wait is not None else "",
        "wait_key": wait.key if wait is not None else "",
        "wake_at": wait.until if wait is not None else None,
        "updated_at": now,
    }


def ended(status: RunStatus, now: datetime) -> dict[str, Any]:
    """What a run's row is set to as it ends ``status``: let go, waiting for nothing,
    finished at ``now``."""
    return {**let_go(status, None, now), "finished_at": now}


class StaleDriver(Exception):
    """This driver's token is no longer the run's: another driver took the run (or it
    finished, or was cancelled). The write rolled back; the driver stops."""


@dataclass(frozen=True, slots=True)
class Driver:
    """A worker's hold on a run for one advance: the run as taken and its token."""

    run: DrivenRun
    token: str

    def held(self) -> QuerySet[WorkflowRun]:
        """The run's row while this driver still holds it (RUNNING under its token),
        else nothing: the fence of every write a driver makes to its run."""
        return WorkflowRun.objects.filter(
            pk=self.run.pk, driver_token=self.token, status=RunStatus.RUNNING
        )
