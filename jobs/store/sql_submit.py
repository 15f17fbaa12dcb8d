"""The raw SQL of submission, as named builders in the manner of
:mod:`jobs.store.sql`: named parameters, named result columns, cached texts. A single
submit is :func:`insert_jobs` on both databases; a bulk submission on PostgreSQL is
one statement of JSON rows (:data:`INSERT_NEW_JOBS_JSON`, with
:data:`INSERT_JOBS_JSON` as the fallback of a lost race).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from ..db import values_of
from ..types import IDENTITY_FIELDS, JobStatus
from .sql import JOB, LANE, SCOPE_WEIGHT, UNIQUE_HOLD

#: A new job's columns that vary from job to job, in the one order every reader takes
#: them in — its identity, its submission's fields (:data:`jobs.types.IDENTITY_FIELDS`)
#: and its submitter's trace context —, with their PostgreSQL types.
NEW_JOB_ROW: Mapping[str, str] = {
    "scope_hash": "varchar",
    "job_id": "varchar",
    "handler": "varchar",
    "handler_version": "int",
    "payload_json": "text",
    "queue": "varchar",
    "priority": "smallint",
    "max_attempts": "int",
    "initial_not_before": "timestamptz",
    "cost": "int",
    "trace_context": "text",
}
assert tuple(NEW_JOB_ROW)[2:-1] == IDENTITY_FIELDS
#: A new job's fixed values, by column: every job starts Queued, never claimed, with
#: nothing to report. The columns neither here nor in :data:`NEW_JOB_COLUMNS` start
#: NULL.
NEW_JOB_FIXED: Mapping[str, str | int | bool] = {
    "status": JobStatus.QUEUED.value,
    "attempt_count": 0,
    "snooze_count": 0,
    "cancel_requested": False,
    "progress_message": "",
    "error": "",
    "leased_by": "",
}
#: The columns of a new job that vary from job to job; ``next_run_at`` is the
#: not-before time or, without one, ``created_at``; ``fair_at`` its place in line
#: (:mod:`jobs.fair_share`).
NEW_JOB_VARYING = (*NEW_JOB_ROW, "next_run_at", "fair_at", "start_by", "limit_key")
#: The columns every job of a bulk insert starts with the same value in.
NEW_JOB_SHARED = (*NEW_JOB_FIXED, "created_at", "updated_at")
#: The columns a new job's insert sets, from parameters of the same names (the others
#: start NULL).
NEW_JOB_COLUMNS = (*NEW_JOB_VARYING, *NEW_JOB_SHARED)

#: What a bulk insert passes once for the whole batch rather than in each JSON row.
_PER_BATCH = ("trace_context",)
#: PostgreSQL: the values of a bulk insert's JSON row — one JSON array per job —, in
#: this order: :data:`NEW_JOB_ROW` but the per-batch values. ``scope_hash`` travels as
#: a 1-based position in the ``scopes`` parameter (a scope hash is 64 characters and
#: a batch has few scopes).
JSON_ROW = tuple(name for name in NEW_JOB_ROW if name not in _PER_BATCH)


def _json_value(name: str) -> str:
    """How a bulk insert's JSON row ``r.v`` gives the :data:`NEW_JOB_ROW` value ``name``."""
    if name in _PER_BATCH:
        return f"%({name})s::{NEW_JOB_ROW[name]}"
    position = JSON_ROW.index(name)
    if name == "scope_hash":
        return f"(%(scopes)s::varchar[])[(r.v->>{position})::int]"
    return f"(r.v->>{position})::{NEW_JOB_ROW[name]}"


_JSON_ROW = {name: _json_value(name) for name in NEW_JOB_ROW}
#: A JSON row's last value, after :data:`JSON_ROW`'s: the job's place in line.
_JSON_FAIR_AT = f"(r.v->>{len(JSON_ROW)})::bigint"
#: And after it, its start deadline (null: none).
_JSON_START_BY = f"(r.v->>{len(JSON_ROW) + 1})::timestamptz"
#: And last, its limit key ("" for none).
_JSON_LIMIT_KEY = f"(r.v->>{len(JSON_ROW) + 2})::varchar"


# --------------------------------------------------------------------------- lanes


def _head(queue: str, priority: str) -> str:
    """The first Queued job's place in line in ``queue`` at ``priority`` (SQL
    expressions), through ``jobs_job_line_idx``; NULL if there is none. A job held
    behind an earlier one of its sequence is not in line."""
    return (
        f"(SELECT h.fair_at FROM {JOB} AS h WHERE h.queue = {queue}"
        f" AND h.priority = {priority} AND h.status = '{JobStatus.QUEUED.value}'"
        " AND NOT h.sequence_held ORDER BY h.fair_at LIMIT 1)"
    )


def _step(scope_hash: str) -> str:
    """The distance between two places of scope ``scope_hash`` (an SQL expression):
    ``quantum`` over its weight, 1 without a ``jobs_scopeweight`` row."""
    return (
        "CAST(ROUND(CAST(%(quantum)s AS double precision) / COALESCE((SELECT sw.weight FROM"
        f" {SCOPE_WEIGHT} AS sw WHERE sw.scope_hash = {scope_hash}), 1.0)) AS bigint)"
    )


def _lane_upsert(vendor: str, rows: str) -> str:
    """The upsert of lanes from ``rows`` (a SELECT of ``queue``, ``scope_hash``, ``tail``
    — the head's place, or ``now_place``, plus ``taken`` steps —, ``step`` and
    ``taken``): a lane that exists moves ``taken`` steps past the later of its tail and
    the head. Returns each lane's ``queue``, ``scope_hash``, new ``tail`` and ``step``."""
    greatest = "GREATEST" if vendor == "postgresql" else "MAX"
    return (
        f"INSERT INTO {LANE} AS l (queue, scope_hash, tail, step, taken) {rows}"
        " ON CONFLICT (queue, scope_hash) DO UPDATE"
        f" SET tail = {greatest}(excluded.tail, l.tail + excluded.taken * excluded.step),"
        " step = excluded.step, taken = excluded.taken"
        " RETURNING queue, scope_hash, tail, step"
    )


@functools.lru_cache(maxsize=8)
def reserve_lane(vendor: str, *, new_job: bool = False) -> str:
    """Take ``units`` places in line for scope ``scope_hash`` in the fair queue
    ``queue`` at priority ``priority``: the lane's tail moves ``units`` steps past the
    later of itself and the head of the line — the first Queued job's place at that
    priority, or ``now_place`` when there is none —, a step being ``quantum`` over the
    scope's weight (``jobs_scopeweight``, 1 without a row). The upsert waits for the
    row's lock and reads its latest tail, so racing submits of one scope take distinct
    places. Returns the new ``tail`` and the ``step``: the places taken are ``tail``,
    ``tail - step``… With ``new_job``, only if job ``job_id`` of the scope does not
    exist yet (a repeated submission takes no place)."""
    # Each parameter typed where it is used: PostgreSQL's server-side parameters take
    # one type per parameter, and SQLite reads these type names as affinities.
    queue, scope_hash, units = (
        "CAST(%(queue)s AS varchar)",
        "CAST(%(scope_hash)s AS varchar)",
        "CAST(%(units)s AS bigint)",
    )
    guard = (
        f" AND NOT EXISTS (SELECT 1 FROM {JOB} AS j WHERE j.scope_hash = {scope_hash}"
        " AND j.job_id = CAST(%(job_id)s AS varchar))"
        if new_job
        else ""
    )
    head = _head(queue, "CAST(%(priority)s AS smallint)")
    rows = (
        f"SELECT {queue}, {scope_hash},"
        f" COALESCE({head}, CAST(%(now_place)s AS bigint)) + {units} * w.step, w.step, {units}"
        f" FROM (SELECT {_step(scope_hash)} AS step) AS w WHERE {units} > 0{guard}"
    )
    return _lane_upsert(vendor, rows)


# --------------------------------------------------------------------------- inserts


#: The columns a single submit with a unique key sets too (``unique_key_0``…).
UNIQUE_COLUMNS = ("unique_key", "unique_while", "debounce_until")
#: The columns a job of a batch or of a sequence sets too (``batch_id_0``…): a job of a
#: sequence is inserted held, and released by its admission (see
#: :data:`jobs.store.sql_endings.ADMIT_MANY`).
MEMBER_COLUMNS = ("batch_id", "sequence_key", "sequence_held")


@functools.lru_cache(maxsize=64)
def insert_jobs(
    rows: int,
    *,
    notify: bool = False,
    lane: bool = False,
    unique: bool = False,
    member: bool = False,
) -> str:
    """``INSERT … ON CONFLICT DO NOTHING`` of ``rows`` new jobs (:func:`jobs.db.numbered`
    parameters of :data:`NEW_JOB_COLUMNS`), returning the ``scope_hash``, ``job_id``,
    ``queue`` and ``fair_at`` of each job actually inserted.

    With ``notify`` (PostgreSQL, due jobs), the same statement also sends the wake-up
    on ``channel``: a single submit is one round trip, and the notification is
    delivered when the statement's transaction commits. With ``lane`` (PostgreSQL, one
    due job of a fair queue), it also takes the job's place in line
    (:func:`reserve_lane` with ``new_job``, whose parameters it takes too), in place of
    ``fair_at_0``. With ``unique`` (one job with a unique key), it sets the
    :data:`UNIQUE_COLUMNS` too and yields to any unique constraint, the identity or a
    key held (``ON CONFLICT DO NOTHING`` with no target). With ``member``, the
    :data:`MEMBER_COLUMNS` too.
    """
    columns = (*NEW_JOB_COLUMNS, *UNIQUE_COLUMNS) if unique else NEW_JOB_COLUMNS
    if member:
        columns = (*columns, *MEMBER_COLUMNS)
    values = values_of(columns, rows)
    if lane:
        values = values.replace("%(fair_at_0)s", "COALESCE((SELECT tail FROM lane), %(fair_at_0)s)")
    conflict = "" if unique else " (scope_hash, job_id)"
    insert = (
        f"INSERT INTO {JOB} ({', '.join(columns)}) VALUES {values}"
        f" ON CONFLICT{conflict} DO NOTHING"
        " RETURNING scope_hash, job_id, queue, fair_at"
    )
    ctes = [f"lane AS ({reserve_lane('postgresql', new_job=True)})"] if lane else []
    if not notify:
        if not ctes:
            return insert
        return f"WITH {', '.join(ctes)} {insert}"
    ctes.append(f"inserted AS ({insert})")
    return (
        f"WITH {', '.join(ctes)}"
        " SELECT scope_hash, job_id, queue, fair_at, pg_notify(%(channel)s, queue) AS notified"
        " FROM inserted"
    )


#: PostgreSQL: a bulk insert as few parameters whatever the number of rows: ``rows``,
#: a JSON array with one array per job (:data:`JSON_ROW`, then its ``fair_at`` and
#: ``start_by`` and ``limit_key``; the
#: client's C JSON encoder writes it, the server parses it once); ``scopes``,
#: ``trace_context`` and
#: the :data:`NEW_JOB_SHARED` columns. Returns the ``scope_hash`` and ``job_id`` of
#: each job actually inserted.
@functools.lru_cache(maxsize=2)
def insert_jobs_json(*, member: bool = False) -> str:
    """PostgreSQL: :data:`INSERT_JOBS_JSON`; with ``member``, the jobs of batch
    ``batch_id`` (NULL: none) and each row's ``sequence_key`` after its ``limit_key``
    (a job of a sequence is inserted held)."""
    columns = (*NEW_JOB_COLUMNS, *MEMBER_COLUMNS) if member else NEW_JOB_COLUMNS
    sequence_key = f"(r.v->>{len(JSON_ROW) + 3})::varchar"
    members = (
        f", %(batch_id)s::varchar, {sequence_key}, {sequence_key} IS NOT NULL" if member else ""
    )
    return (
        f"INSERT INTO {JOB} ({', '.join(columns)})"
        f" SELECT {', '.join(_JSON_ROW.values())},"
        f" COALESCE({_JSON_ROW['initial_not_before']}, %(created_at)s), {_JSON_FAIR_AT},"
        f" {_JSON_START_BY}, {_JSON_LIMIT_KEY},"
        f" {', '.join(f'%({name})s' for name in NEW_JOB_SHARED)}{members}"
        " FROM jsonb_array_elements(%(rows)s::jsonb) AS r(v)"
        " ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING scope_hash, job_id"
    )


INSERT_JOBS_JSON = insert_jobs_json()


@functools.lru_cache(maxsize=2)
def insert_new_jobs_json(*, member: bool = False) -> str:
    """:data:`INSERT_NEW_JOBS_JSON`; with ``member``, the jobs of batch ``batch_id``
    (NULL: none), each row's ``sequence_key`` after its ``limit_key`` (a job of a
    sequence is inserted held)."""
    sequence_key = f", (r.v->>{len(JSON_ROW) + 3})::varchar AS sequence_key" if member else ""
    columns = (*NEW_JOB_COLUMNS, *MEMBER_COLUMNS) if member else NEW_JOB_COLUMNS
    members = ", %(batch_id)s::varchar, sequence_key, sequence_key IS NOT NULL" if member else ""
    return (
        "WITH r AS (SELECT r.ord - 1 AS ord, "
        + ", ".join(f"{value} AS {name}" for name, value in _JSON_ROW.items())
        + f", {_JSON_FAIR_AT} AS due_place, {_JSON_START_BY} AS start_by,"
        f" {_JSON_LIMIT_KEY} AS limit_key{sequence_key}"
        + " FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS r(v, ord)),"
        # The due jobs of fair queues take their places from their scopes' lanes: each lane
        # once, by as many steps as it has jobs here, the jobs in the order given.
        " laned AS (SELECT ord, queue, scope_hash, priority,"
        " row_number() OVER (PARTITION BY queue, scope_hash ORDER BY ord) AS rank,"
        " count(*) OVER (PARTITION BY queue, scope_hash) AS n FROM r"
        " WHERE queue = ANY(%(fair_queues)s::varchar[])"
        " AND (initial_not_before IS NULL OR initial_not_before <= %(created_at)s)),"
        " lanes AS ("
        + _lane_upsert(
            "postgresql",
            f"SELECT g.queue, g.scope_hash, COALESCE({_head('g.queue', 'g.priority')},"
            f" %(now_place)s::bigint) + g.n * {_step('g.scope_hash')}, {_step('g.scope_hash')}, g.n"
            " FROM (SELECT queue, scope_hash, max(priority) AS priority, max(n) AS n FROM laned"
            " GROUP BY queue, scope_hash) AS g",
        )
        + "),"
        " placed AS (SELECT r.*, COALESCE(lanes.tail - (laned.n - laned.rank) * lanes.step,"
        " r.due_place) AS fair_at FROM r LEFT JOIN laned ON laned.ord = r.ord"
        " LEFT JOIN lanes ON lanes.queue = laned.queue AND lanes.scope_hash = laned.scope_hash),"
        f" inserted AS (INSERT INTO {JOB} ({', '.join(columns)})"
        f" SELECT {', '.join(NEW_JOB_ROW)}, COALESCE(initial_not_before, %(created_at)s), fair_at,"
        " start_by, limit_key,"
        f" {', '.join(f'%({name})s' for name in NEW_JOB_SHARED)}{members}"
        f" FROM placed AS r WHERE NOT EXISTS (SELECT FROM {JOB} AS j"
        " WHERE j.scope_hash = r.scope_hash AND j.job_id = r.job_id)"
        " RETURNING scope_hash, job_id, queue, next_run_at)"
        # The skipped positions are looked for only when fewer rows went in than came.
        " SELECT CASE WHEN (SELECT count(*) FROM inserted) = %(count)s THEN '{}'::bigint[]"
        " ELSE ARRAY(SELECT r.ord FROM r WHERE NOT EXISTS (SELECT FROM inserted AS i"
        " WHERE i.scope_hash = r.scope_hash AND i.job_id = r.job_id) ORDER BY r.ord) END"
        " AS skipped,"
        " (SELECT count(pg_notify(%(channel)s, d.queue)) FROM (SELECT DISTINCT queue"
        " FROM inserted WHERE next_run_at <= %(created_at)s) AS d) AS notified"
    )


#: PostgreSQL: a whole bulk submission as one statement, run in autocommit (its own
#: transaction, one round trip). Parameters as for :data:`INSERT_JOBS_JSON`; rows are
#: distinct identities. A row whose identity is stored already is left out by the
#: ``NOT EXISTS`` guard, not by ``ON CONFLICT``: a plain insert skips the speculative
#: insertion (one WAL record and a second probe of the identity index per job). A
#: concurrent insert of the same identity makes the statement fail with a unique
#: violation instead; the caller then rolls back and falls back on
#: :data:`INSERT_JOBS_JSON`. One row back: ``skipped``, the 0-based positions
#: in ``rows`` not inserted (their identities exist; ``count`` is the number of
#: rows), and ``notified``, the queues of due jobs woken (on ``channel``, once each).
#: The due jobs of the ``fair_queues`` take their places in line from their scopes'
#: lanes in the same statement (see :func:`reserve_lane`; ``quantum``, ``now_place``);
#: the others keep the place their row gives (their due time).
INSERT_NEW_JOBS_JSON = insert_new_jobs_json()


# --------------------------------------------------------------------------- uniqueness

#: A unique key held for a time: take (``scope_hash``, ``unique_key``) for job
#: ``job_id`` until ``until`` — a new hold, or one that ended at or before ``now``.
#: Returns the ``job_id`` if it was taken; no row: another job holds the key.
TAKE_HOLD = (
    f"INSERT INTO {UNIQUE_HOLD} AS h (scope_hash, unique_key, job_id, until)"
    " VALUES (%(scope_hash)s, %(unique_key)s, %(job_id)s, %(until)s)"
    " ON CONFLICT (scope_hash, unique_key) DO UPDATE"
    " SET job_id = excluded.job_id, until = excluded.until WHERE h.until <= %(now)s"
    " RETURNING job_id"
)


def _place_of(column: str, vendor: str) -> str:
    """A stored timestamp ``column`` as a place in line (microseconds since the
    epoch; see :func:`jobs.fair_share.place`)."""
    if vendor == "postgresql":
        return f"(extract(epoch FROM {column}) * 1000000)::bigint"
    # SQLite keeps ISO text: whole seconds from strftime, the fraction from the text.
    return (
        f"(CAST(strftime('%%s', {column}) AS INTEGER) * 1000000"
        f" + CAST(substr(strftime('%%f', {column}), 4) AS INTEGER) * 1000"
        f" + CASE WHEN length({column}) >= 26 THEN CAST(substr({column}, 24, 3) AS INTEGER)"
        " ELSE 0 END)"
    )


@functools.lru_cache(maxsize=4)
def debounce_job(vendor: str) -> str:
    """Debounce: the scope's Queued job that holds ``unique_key`` in the "queued" mode,
    not claimed and without a cancel request, takes ``payload_json`` and is due at
    ``run_at`` (its place ``run_place``) — or at its ``debounce_until``, if that is
    sooner. Returns the job's ``job_id``."""
    sooner = "debounce_until IS NOT NULL AND debounce_until < %(run_at)s"
    return (
        f"UPDATE {JOB} SET payload_json = %(payload_json)s,"
        f" next_run_at = CASE WHEN {sooner} THEN debounce_until ELSE %(run_at)s END,"
        f" fair_at = CASE WHEN {sooner} THEN {_place_of('debounce_until', vendor)}"
        " ELSE %(run_place)s END, updated_at = %(now)s"
        " WHERE scope_hash = %(scope_hash)s AND unique_key = %(unique_key)s"
        f" AND unique_while = 'queued' AND status = '{JobStatus.QUEUED.value}'"
        " AND NOT cancel_requested RETURNING job_id"
    )
