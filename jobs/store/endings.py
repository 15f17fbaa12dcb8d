"""What follows, in the same transaction, when jobs move into, out of or between final
states: their batches' counts and ``then`` jobs, their sequences' holds.

One place for every such statement of the store (see :mod:`jobs.store.sql_endings`):

- On PostgreSQL the statement that moves the jobs counts their batches, inserts the
  ``then`` of a batch it finishes and moves its sequences' counts itself
  (:func:`jobs.store.sql_endings.ending_ctes`, through :func:`ending_params`); on
  SQLite, which has no data-modifying CTEs, :func:`follow` does it in the statements
  after, under the same write lock.
- Then, on both, :func:`follow` halts the sequences whose job ended Failed under a
  handler declared ``sequence_halts_on_failure=True`` and releases the next held job
  of every other sequence with no job Queued or Running left — in a statement whose
  snapshot is taken after the sequences' rows were locked, so that no job a
  concurrent submit held behind them is missed.

A caller that moves jobs of sequences runs all of it in one transaction (the worker's
finish-and-claim knows from its claims: :attr:`jobs.types.Claim.sequence_key`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import adapt_dt, is_postgres

from ..conf import jobs_settings
from ..db import fetch, numbered
from ..fair_share import place
from ..flow_control import halting_handlers
from ..types import JobStatus
from . import sql_endings
from .base import CHUNK_ROWS

#: Statuses a job moves from when it becomes final (Queued or Running: ``pending``).
PENDING = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


@dataclass(frozen=True, slots=True)
class Moved:
    """A job that a statement moved: its primary key, identity, handler, queue, old
    (``was``) and new ``status``, and its batch and sequence (None: none)."""

    id: int
    scope_hash: str
    job_id: str
    handler: str
    queue: str
    was: str
    status: str
    batch_id: str | None
    sequence_key: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], was: str) -> Moved:
        """A job from a row with :data:`sql_endings.ENDING_COLUMNS`."""
        return cls(
            id=row["id"],
            scope_hash=row["scope_hash"],
            job_id=row["job_id"],
            handler=row["handler"],
            queue=row["queue"],
            was=was,
            status=row["status"],
            batch_id=row["batch_id"],
            sequence_key=row["sequence_key"],
        )

    @property
    def concerned(self) -> bool:
        """Whether its batch or sequence has anything to follow."""
        return self.batch_id is not None or self.sequence_key is not None


def ending_params(connection: BaseDatabaseWrapper, now: datetime) -> dict[str, Any]:
    """The parameters of :func:`sql_endings.ending_ctes` at ``now``."""
    return {
        "now": adapt_dt(connection, now),
        "now_place": place(now),
        "channel": jobs_settings().NOTIFY_CHANNEL,
    }


def run_moving(
    connection: BaseDatabaseWrapper,
    statement: str,
    params: dict[str, Any],
    now: datetime,
    *,
    was: str,
) -> list[dict[str, Any]]:
    """Run ``statement`` (an UPDATE of jobs returning :data:`sql_endings.ENDING_COLUMNS`)
    that moves every job it returns from status ``was``, with what follows: inside it
    on PostgreSQL (:func:`sql_endings.with_endings`), after it on SQLite, then
    :func:`follow`. In the caller's transaction. Returns the statement's rows."""
    postgres = is_postgres(connection)
    values = {**params, **ending_params(connection, now)}
    if postgres:
        statement = sql_endings.with_endings(statement, f"'{was}'")
    rows = fetch(connection, statement, values)
    follow(connection, [Moved.from_row(row, was) for row in rows], now, counted=postgres)
    return rows


def follow(
    connection: BaseDatabaseWrapper,
    moved: Iterable[Moved],
    now: datetime,
    *,
    counted: bool,
) -> None:
    """What follows the moves of ``moved`` in the caller's transaction. ``counted``:
    the statement that moved them counted their batches and sequences itself
    (PostgreSQL, :func:`sql_endings.ending_ctes`); else (SQLite) this does first."""
    concerned = [job for job in moved if job.concerned and _bucket(job.was) != _bucket(job.status)]
    if not concerned:
        return
    params = {"now": adapt_dt(connection, now), "now_place": place(now)}
    if not counted:
        count_batches(connection, concerned, params)
        _count_sequences(connection, concerned, params)
    _release(connection, concerned, params)


def admit(
    connection: BaseDatabaseWrapper, jobs: Sequence[tuple[str, str, str]], now: datetime
) -> None:
    """New jobs of sequences, inserted held — ``(scope_hash, job_id, sequence_key)`` in
    submission order — counted in their sequences in the submit's transaction (their
    rows locked, in key order); in a sequence with no other open job and not halted,
    the first of them is released. A job of a sequence with open jobs stays held until
    the statement that ends the last of those releases it (:func:`follow`)."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for scope_hash, job_id, key in jobs:
        group = groups.setdefault((scope_hash, key), [job_id, 0])
        group[1] += 1
    if not groups:
        return
    ordered = sorted(groups.items())
    when = adapt_dt(connection, now)
    if is_postgres(connection):
        fetch(
            connection,
            sql_endings.ADMIT_MANY,
            {
                "now": when,
                "scopes": [scope_hash for (scope_hash, _key), _group in ordered],
                "keys": [key for (_scope_hash, key), _group in ordered],
                "counts": [count for _identity, (_first, count) in ordered],
                "firsts": [first for _identity, (first, _count) in ordered],
            },
        )
        return
    for (scope_hash, key), (first, count) in ordered:
        identity = {"scope_hash": scope_hash, "sequence_key": key}
        (row,) = fetch(connection, sql_endings.ADMIT, {**identity, "count": count, "now": when})
        if row["open"] == count and row["halted_by"] is None:
            fetch(connection, sql_endings.RELEASE_NEW, {"scope_hash": scope_hash, "job_id": first})


def readmit(connection: BaseDatabaseWrapper, job: Moved, now: datetime) -> None:
    """A final job of a sequence Queued again (a retry), in the caller's transaction:
    counted in its batch, and in its sequence — where it goes on at once if it is the
    job that halts the sequence, or if no other job of the sequence is open; else it is
    held until those before it end."""
    params = {"now": adapt_dt(connection, now), "now_place": place(now)}
    count_batches(connection, [job], params)
    if job.sequence_key is None:
        return
    key = {"scope_hash": job.scope_hash, "sequence_key": job.sequence_key}
    (row,) = fetch(connection, sql_endings.ADMIT, {**params, **key, "count": 1})
    halted_by = row["halted_by"]
    if halted_by == job.job_id:
        # It halted the sequence: every other open job of it is held behind it.
        fetch(connection, sql_endings.UNHALT, {**params, **key, "job_id": job.job_id})
        fetch(connection, sql_endings.RELEASE_ONE, {**params, "id": job.id})
    elif row["open"] > 1 or halted_by is not None:
        fetch(connection, sql_endings.HOLD_ONE, {"id": job.id})
    else:
        # It may have ended held (a cancel or an expiry of a held job keeps the flag).
        fetch(connection, sql_endings.RELEASE_ONE, {**params, "id": job.id})


def release_params(
    sequences: Sequence[tuple[str, str]], halts: Sequence[tuple[str, str, str]] = ()
) -> dict[str, Any]:
    """PostgreSQL: :data:`sql_endings.RELEASE`'s parameters but ``now``: the
    ``sequences`` (scope hash, key) to release the next job of, the ``halts`` (scope
    hash, key, job id) to halt first."""
    return {
        "halt_scopes": [halt[0] for halt in halts],
        "halt_keys": [halt[1] for halt in halts],
        "halt_jobs": [halt[2] for halt in halts],
        "scopes": [sequence[0] for sequence in sequences],
        "keys": [sequence[1] for sequence in sequences],
        "channel": jobs_settings().NOTIFY_CHANNEL,
    }


def _bucket(status: str) -> str:
    if status in PENDING:
        return "pending"
    if status == JobStatus.INTERRUPTED.value:
        return "failed"
    return status


def count_batches(
    connection: BaseDatabaseWrapper, moved: Sequence[Moved], params: dict[str, Any]
) -> None:
    """The batches' counts, and the ``then`` of each batch taken to 0, in statements of
    their own (SQLite's finishes; a retry on both databases)."""
    moves: dict[tuple[str, str], Counter[str]] = {}
    for job in moved:
        if job.batch_id is not None:
            counts = moves.setdefault((job.scope_hash, job.batch_id), Counter())
            counts[_bucket(job.status)] += 1
            counts[_bucket(job.was)] -= 1
    if not moves:
        return
    rows = [
        {
            "scope_hash": scope_hash,
            "batch_id": batch_id,
            **{name: counts[name] for name in ("pending", *sql_endings.BUCKETS)},
        }
        for (scope_hash, batch_id), counts in sorted(moves.items())
    ]
    done = []
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[start : start + CHUNK_ROWS]
        statement = sql_endings.batch_moves_sqlite(len(chunk))
        for row in fetch(connection, statement, {**params, **numbered(chunk)}):
            if row["pending"] == 0 and moves[(row["scope_hash"], row["batch_id"])]["pending"] < 0:
                done.append({"scope_hash": row["scope_hash"], "batch_id": row["batch_id"]})
    if done:
        fetch(
            connection,
            sql_endings.insert_thens_sqlite(len(done)),
            {**params, **numbered(done)},
        )


def _count_sequences(
    connection: BaseDatabaseWrapper, moved: Sequence[Moved], params: dict[str, Any]
) -> None:
    """SQLite: the sequences' ``open`` counts (their rows locked)."""
    moves: Counter[tuple[str, str]] = Counter()
    for job in moved:
        if job.sequence_key is not None:
            key = (job.scope_hash, job.sequence_key)
            moves[key] += (job.status in PENDING) - (job.was in PENDING)
    rows = [
        {"scope_hash": scope_hash, "sequence_key": key, "open": count}
        for (scope_hash, key), count in sorted(moves.items())
    ]
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[start : start + CHUNK_ROWS]
        fetch(
            connection,
            sql_endings.sequence_moves_sqlite(len(chunk)),
            {**params, **numbered(chunk)},
        )


def _release(
    connection: BaseDatabaseWrapper, moved: Sequence[Moved], params: dict[str, Any]
) -> None:
    """Halt the sequences of jobs that ended Failed under a handler that halts on
    failure, then release the next job of every other sequence of ``moved`` that has
    none Queued or Running."""
    halting = halting_handlers()
    sequences = sorted({(j.scope_hash, j.sequence_key) for j in moved if j.sequence_key})
    if not sequences:
        return
    halts = sorted(
        {
            (job.scope_hash, job.sequence_key, job.job_id)
            for job in moved
            if job.sequence_key is not None
            and job.status == JobStatus.FAILED.value
            and job.handler in halting
        }
    )
    if is_postgres(connection):
        fetch(connection, sql_endings.RELEASE, {**params, **release_params(sequences, halts)})
        return
    halted = set()
    for scope_hash, key, job_id in halts:
        fetch(
            connection,
            sql_endings.HALT_SQLITE,
            {**params, "scope_hash": scope_hash, "sequence_key": key, "job_id": job_id},
        )
        halted.add((scope_hash, key))
    free = [
        {"scope_hash": scope_hash, "sequence_key": key}
        for scope_hash, key in sequences
        if (scope_hash, key) not in halted
    ]
    for start in range(0, len(free), CHUNK_ROWS):
        chunk = free[start : start + CHUNK_ROWS]
        fetch(connection, sql_endings.release_sqlite(len(chunk)), {**params, **numbered(chunk)})
