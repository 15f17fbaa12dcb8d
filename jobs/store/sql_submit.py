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
from .sql import JOB

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
#: not-before time or, without one, ``created_at``.
NEW_JOB_VARYING = (*NEW_JOB_ROW, "next_run_at")
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


@functools.lru_cache(maxsize=64)
def insert_jobs(rows: int, *, notify: bool = False) -> str:
    """``INSERT … ON CONFLICT DO NOTHING`` of ``rows`` new jobs (:func:`jobs.db.numbered`
    parameters of :data:`NEW_JOB_COLUMNS`), returning the ``scope_hash``, ``job_id``
    and ``queue`` of each job actually inserted.

    With ``notify`` (PostgreSQL, due jobs), the same statement also sends the wake-up
    on ``channel``: a single submit is one round trip, and the notification is
    delivered when the statement's transaction commits.
    """
    insert = (
        f"INSERT INTO {JOB} ({', '.join(NEW_JOB_COLUMNS)})"
        f" VALUES {values_of(NEW_JOB_COLUMNS, rows)}"
        " ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING scope_hash, job_id, queue"
    )
    if not notify:
        return insert
    return (
        f"WITH inserted AS ({insert})"
        " SELECT scope_hash, job_id, queue, pg_notify(%(channel)s, queue) AS notified"
        " FROM inserted"
    )


#: PostgreSQL: a bulk insert as few parameters whatever the number of rows: ``rows``,
#: a JSON array with one array per job (:data:`JSON_ROW`; the client's C JSON
#: encoder writes it, the server parses it once); ``scopes``, ``trace_context`` and
#: the :data:`NEW_JOB_SHARED` columns. Returns the ``scope_hash`` and ``job_id`` of
#: each job actually inserted.
INSERT_JOBS_JSON = (
    f"INSERT INTO {JOB} ({', '.join(NEW_JOB_COLUMNS)})"
    f" SELECT {', '.join(_JSON_ROW.values())},"
    f" COALESCE({_JSON_ROW['initial_not_before']}, %(created_at)s),"
    f" {', '.join(f'%({name})s' for name in NEW_JOB_SHARED)}"
    " FROM jsonb_array_elements(%(rows)s::jsonb) AS r(v)"
    " ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING scope_hash, job_id"
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
INSERT_NEW_JOBS_JSON = (
    "WITH r AS (SELECT r.ord - 1 AS ord, "
    + ", ".join(f"{value} AS {name}" for name, value in _JSON_ROW.items())
    + " FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS r(v, ord)),"
    f" inserted AS (INSERT INTO {JOB} ({', '.join(NEW_JOB_COLUMNS)})"
    f" SELECT {', '.join(NEW_JOB_ROW)}, COALESCE(initial_not_before, %(created_at)s),"
    f" {', '.join(f'%({name})s' for name in NEW_JOB_SHARED)}"
    f" FROM r WHERE NOT EXISTS (SELECT FROM {JOB} AS j"
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
