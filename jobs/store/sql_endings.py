"""The raw SQL of what follows when jobs change between the states a batch counts or
a sequence waits on, as named builders in the manner of :mod:`jobs.store.sql`.

Every statement that makes a job final — a finish (alone, many, or before a claim), a
cancel of a Queued job, an expiry, a put-back that gives up — and every one that takes
a final job back (a retry) or from one final state to another (an operator's cancel
of the Failed job that halts its sequence) changes, in the same transaction:

- the job's **batch** row (``jobs_batch``): its counts move from the job's old bucket
  to its new one (``pending`` for Queued and Running, ``failed`` for Failed and
  Interrupted, else its status). The statement that takes ``pending`` to 0 inserts the
  batch's ``then`` job, ``"<batch id>:then"`` (``ON CONFLICT DO NOTHING``): the batch
  row's lock orders the last finishes, so exactly one of them sees 0. On PostgreSQL
  this is part of the job's own statement (data-modifying CTEs): no statement per job.
- the job's **sequence** row (``jobs_sequence``): ``open`` (its jobs not final) moves
  the same way, which takes the row's lock. A statement that follows in the same
  transaction (:func:`release`) — its snapshot taken once the locks are held, so it sees
  every job a submit held behind them — halts the sequences whose Failed job's handler
  says so and releases the first held job of every other that has no job Queued or
  Running left.

Rows are locked in key order (an upsert of rows sorted by key, as the limit counters
are): no two statements that change several batches or sequences deadlock.
"""

from __future__ import annotations

import functools

from ..db import values_of
from ..models import Batch, Job, Sequence
from ..types import JobStatus

# Of its own, not from jobs.store.sql: that module builds on this one.
JOB = Job._meta.db_table
BATCH = Batch._meta.db_table
SEQUENCE = Sequence._meta.db_table
QUEUED = JobStatus.QUEUED.value
RUNNING = JobStatus.RUNNING.value

#: The buckets a batch counts its jobs in, besides ``pending`` (Queued, Running).
BUCKETS = ("succeeded", "failed", "cancelled", "expired")
#: What a statement that moves jobs returns of each, for what follows: the job's
#: ``id``, identity, ``handler``, ``queue``, new ``status``, ``batch_id`` and
#: ``sequence_key``.
ENDING_COLUMNS = (
    "id",
    "scope_hash",
    "job_id",
    "handler",
    "queue",
    "status",
    "batch_id",
    "sequence_key",
)


def bucket(status: str) -> str:
    """The batch count an SQL ``status`` expression falls in."""
    return (
        f"CASE WHEN {status} IN ('{QUEUED}', '{RUNNING}') THEN 'pending'"
        f" WHEN {status} = '{JobStatus.INTERRUPTED.value}' THEN 'failed' ELSE {status} END"
    )


def _open(status: str) -> str:
    """Whether an SQL ``status`` expression is not final."""
    return f"{status} IN ('{QUEUED}', '{RUNNING}')"


def _moves(source: str, *, batches: bool) -> str:
    """Per batch (or sequence) of the moved jobs of ``source`` (a CTE of
    ``scope_hash``, ``batch_id``, ``sequence_key``, ``was`` — the old status — and
    ``status``), how each count changes."""
    if batches:
        counts = ", ".join(
            f"count(*) FILTER (WHERE {bucket('status')} = '{name}')"
            f" - count(*) FILTER (WHERE {bucket('was')} = '{name}') AS {name}"
            for name in ("pending", *BUCKETS)
        )
        return (
            f"SELECT scope_hash, batch_id, {counts} FROM {source}"
            " WHERE batch_id IS NOT NULL GROUP BY scope_hash, batch_id"
        )
    return (
        f"SELECT scope_hash, sequence_key, count(*) FILTER (WHERE {_open('status')})"
        f" - count(*) FILTER (WHERE {_open('was')}) AS open"
        f" FROM {source} WHERE sequence_key IS NOT NULL GROUP BY scope_hash, sequence_key"
    )


def _batch_upsert(moves: str) -> str:
    """Add ``moves`` (rows of ``scope_hash``, ``batch_id``, ``pending`` and the
    :data:`BUCKETS`, as changes) to their batches, in key order; a batch whose
    ``pending`` reaches 0 finishes at ``now`` (a retry opens it again). Only batches that exist
    are written (the ``EXISTS`` guard: the insert never happens, the upsert is only
    for its order). Returns each batch's key, new ``pending`` and its ``then``."""
    names = ("pending", *BUCKETS)
    sets = ", ".join(f"{name} = b.{name} + excluded.{name}" for name in names)
    return (
        f"INSERT INTO {BATCH} AS b (scope_hash, batch_id, digest, total, {', '.join(names)},"
        " created_at)"
        f" SELECT m.scope_hash, m.batch_id, '', 0, {', '.join(f'm.{n}' for n in names)}, %(now)s"
        f" FROM ({moves}) AS m WHERE EXISTS (SELECT 1 FROM {BATCH} AS e"
        " WHERE e.scope_hash = m.scope_hash AND e.batch_id = m.batch_id)"
        " ORDER BY m.scope_hash, m.batch_id"
        f" ON CONFLICT (scope_hash, batch_id) DO UPDATE SET {sets},"
        " finished_at = CASE WHEN b.pending + excluded.pending = 0"
        " THEN COALESCE(b.finished_at, excluded.created_at) ELSE NULL END"
        # Unqualified: SQLite's RETURNING names the target's columns only so.
        " RETURNING scope_hash, batch_id, pending"
    )


def _sequence_upsert(moves: str) -> str:
    """Add ``moves`` (rows of ``scope_hash``, ``sequence_key``, ``open``) to their
    sequences, in key order, taking their rows' locks (a move of 0 too). Only
    sequences that exist are written. Returns each one's key and new ``open``."""
    return (
        f"INSERT INTO {SEQUENCE} AS s (scope_hash, sequence_key, open, updated_at)"
        " SELECT m.scope_hash, m.sequence_key, m.open, %(now)s"
        f" FROM ({moves}) AS m WHERE EXISTS (SELECT 1 FROM {SEQUENCE} AS e"
        " WHERE e.scope_hash = m.scope_hash AND e.sequence_key = m.sequence_key)"
        " ORDER BY m.scope_hash, m.sequence_key"
        " ON CONFLICT (scope_hash, sequence_key) DO UPDATE SET open = s.open + excluded.open,"
        " updated_at = excluded.updated_at RETURNING scope_hash, sequence_key, open"
    )


#: A ``then`` job's columns as its insert sets them: a new job's
#: (:data:`jobs.store.sql_submit.NEW_JOB_COLUMNS`, a test holds them equal), from its
#: batch's row.
THEN_VALUES = {
    "scope_hash": "COALESCE(b.then_scope_hash, b.scope_hash)",
    "job_id": "COALESCE(b.then_job_id, b.batch_id || ':then')",
    "handler": "b.then_handler",
    "handler_version": "b.then_version",
    "payload_json": "b.then_payload_json",
    "queue": "b.then_queue",
    "priority": "b.then_priority",
    "max_attempts": "b.then_max_attempts",
    "initial_not_before": "b.then_not_before",
    "cost": "b.then_cost",
    "trace_context": "b.trace_context",
    "next_run_at": "COALESCE(b.then_not_before, %(now)s)",
    "fair_at": "%(now_place)s",
    "start_by": "NULL",
    "limit_key": "''",
    "status": f"'{QUEUED}'",
    "attempt_count": "0",
    "snooze_count": "0",
    "cancel_requested": "FALSE",
    "progress_message": "''",
    "error": "''",
    "leased_by": "''",
    "created_at": "%(now)s",
    "updated_at": "%(now)s",
}


def _then_insert(batches: str, *, notify: bool = False) -> str:
    """Insert the ``then`` job of every batch of ``batches`` (a query of ``scope_hash``
    and ``batch_id``) that has one: job ``"<batch id>:then"`` of its scope (or the id
    and scope its stager named), due at its
    not-before time or ``now``, placed at ``now_place`` as a job due then. On
    PostgreSQL a due one wakes the workers (on ``channel``, delivered on commit).
    Returns each inserted job's ``queue`` and ``next_run_at``."""
    return (
        f"INSERT INTO {JOB} ({', '.join(THEN_VALUES)})"
        # From the finished batches, each row found by its key: no statement scans
        # the batches.
        f" SELECT {', '.join(THEN_VALUES.values())} FROM ({batches}) AS d"
        f" JOIN {BATCH} AS b ON b.scope_hash = d.scope_hash AND b.batch_id = d.batch_id"
        " WHERE b.then_handler IS NOT NULL ORDER BY b.scope_hash, b.batch_id"
        " ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING queue, next_run_at"
        + (
            ", CASE WHEN next_run_at <= %(now)s THEN pg_notify(%(channel)s, queue) END AS woke"
            if notify
            else ""
        )
    )


def ending_ctes(source: str) -> str:
    """PostgreSQL: what follows the moves of ``source`` (a CTE of ``scope_hash``,
    ``batch_id``, ``sequence_key``, ``was`` and ``status``), as CTEs of the statement
    that moved them: ``batched`` (their batches' counts), ``thens`` (the ``then`` job of
    each batch whose last job this statement ended) and ``sequenced`` (their
    sequences' ``open``, the rows locked for :data:`RELEASE`). Takes ``now``,
    ``now_place`` and ``channel``."""
    done = (
        "SELECT b.scope_hash, b.batch_id FROM batched AS b JOIN batch_moves AS m"
        " ON m.scope_hash = b.scope_hash AND m.batch_id = b.batch_id"
        " WHERE b.pending = 0 AND m.pending < 0"
    )
    return (
        f"batch_moves AS ({_moves(source, batches=True)}),"
        f" batched AS ({_batch_upsert('SELECT * FROM batch_moves')}),"
        f" thens AS ({_then_insert(done, notify=True)}),"
        f" sequenced AS ({_sequence_upsert(_moves(source, batches=False))})"
    )


@functools.lru_cache(maxsize=8)
def with_endings(statement: str, old_status: str) -> str:
    """PostgreSQL: ``statement`` (an UPDATE of jobs returning at least
    :data:`ENDING_COLUMNS`), each row moved from ``old_status`` (an SQL expression of
    the row) to its new status, followed by :func:`ending_ctes` in the same statement.
    Returns the rows of ``statement``."""
    return (
        f"WITH moved AS ({statement}),"
        f" source AS (SELECT scope_hash, batch_id, sequence_key, {old_status} AS was, status"
        f" FROM moved), {ending_ctes('source')} SELECT * FROM moved"
    )


# --------------------------------------------------------------------------- SQLite


@functools.lru_cache(maxsize=64)
def batch_moves_sqlite(rows: int) -> str:
    """SQLite: :func:`_batch_upsert` of ``rows`` moves given as numbered parameters
    (``scope_hash_0``, ``batch_id_0``, ``pending_0``…)."""
    names = ("scope_hash", "batch_id", "pending", *BUCKETS)
    moves = f"SELECT * FROM (VALUES {values_of(names, rows)}) AS v"
    # SQLite names a VALUES list's columns column1…: rename them.
    renamed = ", ".join(f"v.column{n + 1} AS {name}" for n, name in enumerate(names))
    return _batch_upsert(moves.replace("SELECT *", f"SELECT {renamed}", 1))


@functools.lru_cache(maxsize=64)
def sequence_moves_sqlite(rows: int) -> str:
    """SQLite: :func:`_sequence_upsert` of ``rows`` moves (``scope_hash_0``,
    ``sequence_key_0``, ``open_0``…)."""
    names = ("scope_hash", "sequence_key", "open")
    renamed = ", ".join(f"v.column{n + 1} AS {name}" for n, name in enumerate(names))
    return _sequence_upsert(f"SELECT {renamed} FROM (VALUES {values_of(names, rows)}) AS v")


@functools.lru_cache(maxsize=64)
def insert_thens_sqlite(rows: int) -> str:
    """SQLite: the ``then`` jobs of ``rows`` finished batches (``scope_hash_0``,
    ``batch_id_0``…), as :func:`_then_insert`."""
    names = ("scope_hash", "batch_id")
    renamed = ", ".join(f"v.column{n + 1} AS {name}" for n, name in enumerate(names))
    return _then_insert(f"SELECT {renamed} FROM (VALUES {values_of(names, rows)}) AS v")


# --------------------------------------------------------------------------- release


def _next_held(sequences: str) -> str:
    """The first held job of each sequence of ``sequences`` (a query of ``scope_hash``
    and ``sequence_key`` named ``a``) that is not halted and has no job Queued or
    Running left: through ``jobs_job_sequence_idx``."""
    same = "{t}.scope_hash = a.scope_hash AND {t}.sequence_key = a.sequence_key"
    return (
        f"SELECT (SELECT n.id FROM {JOB} AS n WHERE {same.format(t='n')}"
        f" AND n.status IN ('{QUEUED}', '{RUNNING}') AND n.sequence_held = TRUE"
        f" ORDER BY n.id LIMIT 1) AS id FROM ({sequences}) AS a"
        f" WHERE NOT EXISTS (SELECT 1 FROM {SEQUENCE} AS s WHERE {same.format(t='s')}"
        " AND s.halted_by IS NOT NULL)"
        f" AND NOT EXISTS (SELECT 1 FROM {JOB} AS r WHERE {same.format(t='r')}"
        f" AND r.status IN ('{QUEUED}', '{RUNNING}') AND r.sequence_held = FALSE)"
    )


def _release_update(which: str, *, notify: bool = False) -> str:
    """Release the jobs ``which`` selects; on PostgreSQL (``notify``) a due one wakes
    the workers (on ``channel``, delivered on commit)."""
    woke = (
        ", CASE WHEN next_run_at <= %(now)s THEN pg_notify(%(channel)s, queue) END AS woke"
        if notify
        else ""
    )
    return (
        f"UPDATE {JOB} SET sequence_held = FALSE, updated_at = %(now)s"
        f" WHERE id IN ({which}) AND status = '{QUEUED}' AND sequence_held"
        f" RETURNING id, queue, next_run_at{woke}"
    )


#: PostgreSQL: halt, then release. ``halt_scopes``, ``halt_keys``, ``halt_jobs``: the
#: sequences halted by a Failed job (its id) at ``now``; ``scopes``, ``keys``: the
#: sequences whose rows this transaction locked, to release the next job of. Returns
#: each released job's ``id``, ``queue`` and ``next_run_at``; a due one wakes the
#: workers (on ``channel``).
RELEASE = (
    f"WITH halted AS (UPDATE {SEQUENCE} AS s SET halted_by = h.job_id, halted_at = %(now)s"
    " FROM unnest(%(halt_scopes)s::varchar[], %(halt_keys)s::varchar[],"
    " %(halt_jobs)s::varchar[]) AS h(scope_hash, sequence_key, job_id)"
    " WHERE s.scope_hash = h.scope_hash AND s.sequence_key = h.sequence_key"
    " RETURNING s.scope_hash, s.sequence_key),"
    " free AS (SELECT * FROM unnest(%(scopes)s::varchar[], %(keys)s::varchar[])"
    " AS f(scope_hash, sequence_key) WHERE NOT EXISTS (SELECT 1 FROM halted AS h"
    " WHERE h.scope_hash = f.scope_hash AND h.sequence_key = f.sequence_key)) "
    + _release_update(_next_held("SELECT * FROM free"), notify=True)
)


#: SQLite, before :func:`release_sqlite`: halt sequence (``scope_hash``,
#: ``sequence_key``) by job ``job_id`` at ``now``.
HALT_SQLITE = (
    f"UPDATE {SEQUENCE} SET halted_by = %(job_id)s, halted_at = %(now)s"
    " WHERE scope_hash = %(scope_hash)s AND sequence_key = %(sequence_key)s"
)


@functools.lru_cache(maxsize=64)
def release_sqlite(rows: int) -> str:
    """SQLite: :data:`RELEASE`'s release for ``rows`` sequences (``scope_hash_0``,
    ``sequence_key_0``…)."""
    names = ("scope_hash", "sequence_key")
    renamed = ", ".join(f"v.column{n + 1} AS {name}" for n, name in enumerate(names))
    return _release_update(
        _next_held(f"SELECT {renamed} FROM (VALUES {values_of(names, rows)}) AS v")
    )


# --------------------------------------------------------------------------- admission

#: A new job of a sequence, inserted held: count it in its sequence (``scope_hash``,
#: ``sequence_key``; created at ``now`` if new), taking the row's lock. Returns the
#: sequence's ``open`` (this job included) and ``halted_by``.
ADMIT = (
    f"INSERT INTO {SEQUENCE} AS s (scope_hash, sequence_key, open, updated_at)"
    " VALUES (%(scope_hash)s, %(sequence_key)s, %(count)s, %(now)s)"
    " ON CONFLICT (scope_hash, sequence_key) DO UPDATE SET open = s.open + excluded.open,"
    " updated_at = excluded.updated_at RETURNING open, halted_by"
)

_ADMISSIONS = (
    "SELECT * FROM unnest(%(scopes)s::varchar[], %(keys)s::varchar[], %(counts)s::bigint[],"
    " %(firsts)s::varchar[]) AS m(scope_hash, sequence_key, n, first_job)"
)

#: PostgreSQL: admit new jobs of sequences, inserted held, in the submit's transaction:
#: per sequence (``scopes``, ``keys``), its ``counts`` new jobs counted in ``open`` (in
#: key order, taking the rows' locks), and where they are all its open jobs and it is
#: not halted, the first of them (``firsts``, a job id) released at ``now``. Returns
#: each released job's ``id``.
ADMIT_MANY = (
    f"WITH m AS ({_ADMISSIONS}),"
    f" admitted AS (INSERT INTO {SEQUENCE} AS s (scope_hash, sequence_key, open, updated_at)"
    " SELECT scope_hash, sequence_key, n, %(now)s FROM m ORDER BY scope_hash, sequence_key"
    " ON CONFLICT (scope_hash, sequence_key) DO UPDATE SET open = s.open + excluded.open,"
    " updated_at = excluded.updated_at"
    " RETURNING s.scope_hash, s.sequence_key, s.open, s.halted_by)"
    f" UPDATE {JOB} AS j SET sequence_held = FALSE FROM admitted AS a JOIN m"
    " ON m.scope_hash = a.scope_hash AND m.sequence_key = a.sequence_key"
    " WHERE j.scope_hash = m.scope_hash AND j.job_id = m.first_job AND a.open = m.n"
    f" AND a.halted_by IS NULL AND j.sequence_held AND j.status = '{QUEUED}' RETURNING j.id"
)

#: SQLite, after :data:`ADMIT` (``count`` new jobs): release the new job ``job_id`` of
#: scope ``scope_hash``, held at its insert.
RELEASE_NEW = (
    f"UPDATE {JOB} SET sequence_held = FALSE WHERE scope_hash = %(scope_hash)s"
    f" AND job_id = %(job_id)s AND status = '{QUEUED}' AND sequence_held RETURNING id"
)

#: Release job ``id`` (held at its submit, or by a retry) at ``now``.
RELEASE_ONE = (
    f"UPDATE {JOB} SET sequence_held = FALSE, updated_at = %(now)s"
    f" WHERE id = %(id)s AND status = '{QUEUED}' AND sequence_held RETURNING id, queue, next_run_at"
)


# --------------------------------------------------------------------------- a scope's changes

_RETURN_ENDING = f" RETURNING {', '.join(ENDING_COLUMNS)}"

#: Cancel: job ``job_id`` of scope ``scope_hash``, Queued (held or not), ends
#: Cancelled at ``now``. Returns :data:`ENDING_COLUMNS`.
CANCEL_QUEUED = (
    f"UPDATE {JOB} SET status = '{JobStatus.CANCELLED.value}', finished_at = %(now)s,"
    " updated_at = %(now)s WHERE scope_hash = %(scope_hash)s AND job_id = %(job_id)s"
    f" AND status = '{QUEUED}'" + _RETURN_ENDING
)


@functools.lru_cache(maxsize=8)
def cancel_queued_prefixed(prefixes: int) -> str:
    """The Queued jobs of scope ``scope_hash`` whose job id starts with one of
    ``prefixes`` prefixes (``prefix_0``…) end Cancelled at ``now``. Returns
    :data:`ENDING_COLUMNS`."""
    named = " OR ".join(
        f"substr(job_id, 1, length(%(prefix_{n})s)) = %(prefix_{n})s" for n in range(prefixes)
    )
    return (
        f"UPDATE {JOB} SET status = '{JobStatus.CANCELLED.value}', finished_at = %(now)s,"
        " updated_at = %(now)s WHERE scope_hash = %(scope_hash)s"
        f" AND status = '{QUEUED}' AND ({named})" + _RETURN_ENDING
    )


@functools.lru_cache(maxsize=8)
def cancel_queued_ids(rows: int) -> str:
    """The Queued jobs of ``rows`` primary keys (``id_0``…) end Cancelled at ``now``.
    Returns :data:`ENDING_COLUMNS`."""
    named = ", ".join(f"%(id_{n})s" for n in range(rows))
    return (
        f"UPDATE {JOB} SET status = '{JobStatus.CANCELLED.value}', finished_at = %(now)s,"
        f" updated_at = %(now)s WHERE id IN ({named}) AND status = '{QUEUED}'" + _RETURN_ENDING
    )


#: An operator's cancel of the Failed job ``job_id`` that halts its sequence (see
#: :data:`UNHALT`): Failed -> Cancelled. Returns :data:`ENDING_COLUMNS`.
CANCEL_FAILED = (
    f"UPDATE {JOB} SET status = '{JobStatus.CANCELLED.value}', updated_at = %(now)s"
    " WHERE scope_hash = %(scope_hash)s AND job_id = %(job_id)s"
    f" AND status = '{JobStatus.FAILED.value}'" + _RETURN_ENDING
)

#: The sequence (``scope_hash``, ``sequence_key``) halted by job ``job_id`` goes on (a
#: retry or a cancel of that job), the row locked. Returns its ``open``.
UNHALT = (
    f"UPDATE {SEQUENCE} SET halted_by = NULL, halted_at = NULL, updated_at = %(now)s"
    " WHERE scope_hash = %(scope_hash)s AND sequence_key = %(sequence_key)s"
    " AND halted_by = %(job_id)s RETURNING open"
)

#: Hold job ``id`` (Queued again by a retry) behind an earlier one of its sequence.
HOLD_ONE = f"UPDATE {JOB} SET sequence_held = TRUE WHERE id = %(id)s AND status = '{QUEUED}'"


# --------------------------------------------------------------------------- batches

#: A new batch (``scope_hash``, ``batch_id``) of ``total`` jobs, all pending, with its
#: ``digest`` and ``then`` (``then_handler`` NULL: none; ``then_scope_hash`` and
#: ``then_job_id`` NULL: ``"<batch id>:then"`` of its scope), created at ``now``; nothing
#: if the batch id is taken. Returns the new row's ``id``.
INSERT_BATCH = (
    f"INSERT INTO {BATCH} (scope_hash, batch_id, digest, total, pending, succeeded, failed,"
    " cancelled, expired, then_scope_hash, then_job_id, then_handler, then_version,"
    " then_payload_json, then_queue, then_priority, then_max_attempts, then_cost,"
    " then_not_before, trace_context, created_at)"
    " VALUES (%(scope_hash)s, %(batch_id)s, %(digest)s, %(total)s, %(total)s, 0, 0, 0, 0,"
    " %(then_scope_hash)s, %(then_job_id)s, %(then_handler)s, %(then_version)s,"
    " %(then_payload_json)s, %(then_queue)s, %(then_priority)s, %(then_max_attempts)s,"
    " %(then_cost)s, %(then_not_before)s,"
    " %(trace_context)s, %(now)s) ON CONFLICT (scope_hash, batch_id) DO NOTHING RETURNING id"
)
