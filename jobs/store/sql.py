"""The store's raw SQL, as named builders: the statements the ORM cannot express in one
round trip (``INSERT … ON CONFLICT DO NOTHING RETURNING``, ``UPDATE … RETURNING``,
data-modifying CTEs, ``FOR UPDATE SKIP LOCKED`` inside an update).

Parameters are named (``%(token)s``; Django's SQLite backend and psycopg both accept
them, and psycopg sends a name used twice once) and every column a statement returns
has a name, which :func:`jobs.db.fetch` gives back as the keys of each row. Where the
vendors differ, the PostgreSQL and the SQLite form are built side by side by the same
function. A builder's text depends only on its arguments (row counts, which optional
guards), and is cached: the same text each time is what lets PostgreSQL prepare a
statement once per connection.

Constants of a guard — statuses above all — are literals, not parameters, so that even
a generic plan of a prepared statement can prove a partial index's predicate.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

from ..db import random_token_sql
from ..models import Job, JobAttempt
from ..types import FINISHED_STATUSES, JobStatus

JOB = Job._meta.db_table
ATTEMPT = JobAttempt._meta.db_table

QUEUED = JobStatus.QUEUED.value
RUNNING = JobStatus.RUNNING.value
SUCCEEDED = JobStatus.SUCCEEDED.value
CANCELLED = JobStatus.CANCELLED.value
_FINISHED = ", ".join(f"'{status.value}'" for status in FINISHED_STATUSES)


def numbered(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of a multi-row statement: row ``n``'s ``name`` as ``name_n``."""
    return {f"{name}_{n}": value for n, row in enumerate(rows) for name, value in row.items()}


def _numbered_values(names: Iterable[str], rows: int, literals: str = "") -> str:
    """``(%(a_0)s, %(b_0)s…), (%(a_1)s, …)``: the VALUES of :func:`numbered` parameters."""
    names = tuple(names)
    return ", ".join(
        "(" + ", ".join(f"%({name}_{n})s" for name in names) + literals + ")" for n in range(rows)
    )


def _in_list(name: str, count: int) -> str:
    """``%(name_0)s, %(name_1)s…``: the members of an ``IN (…)`` list, ``name_n`` each."""
    return ", ".join(f"%({name}_{n})s" for n in range(count))


def in_list_params(name: str, values: Sequence[Any]) -> dict[str, Any]:
    """The parameters of :func:`_in_list`."""
    return {f"{name}_{n}": value for n, value in enumerate(values)}


# --------------------------------------------------------------------------- wake-ups


#: PostgreSQL: wake listeners (``channel``, ``payload``); delivered on commit.
NOTIFY = "SELECT pg_notify(%(channel)s, %(payload)s)"


# --------------------------------------------------------------------------- submission


#: The columns of a new job that its insert takes from parameters of the same names.
NEW_JOB_PARAMS = (
    "scope_hash",
    "job_id",
    "handler",
    "handler_version",
    "payload_json",
    "queue",
    "priority",
    "max_attempts",
    "initial_not_before",
    "next_run_at",
    "status",
    "cancel_requested",
    "created_at",
    "updated_at",
)
#: The columns every new job starts with the same value in, and those values.
_NEW_JOB_CONSTANTS = {
    "attempt_count": "0",
    "progress_message": "''",
    "error": "''",
    "leased_by": "''",
}
_NEW_JOB_COLUMNS = ", ".join((*NEW_JOB_PARAMS, *_NEW_JOB_CONSTANTS))
_NEW_JOB_LITERALS = "".join(f", {value}" for value in _NEW_JOB_CONSTANTS.values())
#: The columns of the bulk insert on PostgreSQL that travel as arrays, with their types.
NEW_JOB_ARRAYS = {
    "scope_hash": "varchar",
    "job_id": "varchar",
    "handler": "varchar",
    "handler_version": "int",
    "payload_json": "text",
    "queue": "varchar",
    "priority": "smallint",
    "max_attempts": "int",
    "initial_not_before": "timestamptz",
    "next_run_at": "timestamptz",
}


class InsertedRow(TypedDict):
    scope_hash: str
    job_id: str
    queue: str


@functools.lru_cache(maxsize=64)
def insert_jobs(rows: int, *, notify: bool = False) -> str:
    """``INSERT … ON CONFLICT DO NOTHING`` of ``rows`` new jobs (:func:`numbered`
    parameters of :data:`NEW_JOB_PARAMS`), returning an :class:`InsertedRow` per job
    actually inserted.

    With ``notify`` (PostgreSQL, due jobs), the same statement also sends the wake-up
    on ``channel``: a single submit is one round trip, and the notification is
    delivered when the statement's transaction commits.
    """
    insert = (
        f"INSERT INTO {JOB} ({_NEW_JOB_COLUMNS})"
        f" VALUES {_numbered_values(NEW_JOB_PARAMS, rows, _NEW_JOB_LITERALS)}"
        " ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING scope_hash, job_id, queue"
    )
    if not notify:
        return insert
    return (
        f"WITH inserted AS ({insert})"
        " SELECT scope_hash, job_id, queue, pg_notify(%(channel)s, queue) AS notified"
        " FROM inserted"
    )


#: PostgreSQL: a bulk insert as one array parameter per varying column (named after
#: it), whatever the number of rows, so that neither the client nor the server parses
#: thousands of placeholders; ``status``, ``cancel_requested``, ``created_at`` and
#: ``updated_at`` are the same for every row. Returns an :class:`InsertedRow` per job
#: inserted.
INSERT_JOBS_UNNEST = (
    f"INSERT INTO {JOB} ({_NEW_JOB_COLUMNS})"
    f" SELECT {', '.join(NEW_JOB_ARRAYS)}, %(status)s, %(cancel_requested)s,"
    f" %(created_at)s, %(updated_at)s{_NEW_JOB_LITERALS}"
    " FROM unnest("
    + ", ".join(f"%({name})s::{kind}[]" for name, kind in NEW_JOB_ARRAYS.items())
    + f") AS t({', '.join(NEW_JOB_ARRAYS)})"
    " ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING scope_hash, job_id, queue"
)


# --------------------------------------------------------------------------- claiming


class ClaimedRow(TypedDict):
    """A job a claim started, with its new token and attempt number."""

    id: int
    scope_hash: str
    job_id: str
    token: str
    attempt: int
    max_attempts: int
    handler: str
    handler_version: int
    payload_json: str
    queue: str
    priority: int
    next_run_at: Any
    leased_by: str
    started_at: Any


_CLAIMED = tuple(ClaimedRow.__annotations__)
_CLAIM_RETURNING = (
    "id, scope_hash, job_id, current_token AS token, attempt_count AS attempt, max_attempts,"
    " handler, handler_version, payload_json, queue, priority, next_run_at, leased_by,"
    " started_at"
)
_ATTEMPT_INSERT = (
    f"INSERT INTO {ATTEMPT} (job_id, number, token, status, worker_id, progress,"
    " progress_message, error, result_ref, started_at, finished_at)"
)


@functools.lru_cache(maxsize=64)
def claim(vendor: str, *, queues: int, one_job: bool, finishing: bool = False) -> str:
    """The claim: one guarded UPDATE of up to ``limit`` due jobs, returning a
    :class:`ClaimedRow` for each.

    Parameters: ``worker_id``, ``lease_expires_at``, ``now``, ``limit``; with
    ``queues``, ``queue_0``… (see :func:`in_list_params`); with ``one_job``,
    ``scope_hash`` and ``job_id``.

    On PostgreSQL the same statement also inserts each claimed job's Running attempt
    row (a data-modifying CTE), so a claim is one round trip; on SQLite the attempt
    rows follow as a second statement of the same transaction
    (:func:`insert_attempts`). With ``finishing`` (PostgreSQL only), the statement
    first completes a batch of attempts — see :func:`complete_ctes`, whose parameters
    it takes too — and every row it returns has its ``kind``: ``'finished'`` (a
    :class:`FinishedRow`), ``'orphan'`` (a token whose attempt row is missing: then the
    statement changes nothing at all) or ``'claimed'`` (a :class:`ClaimedRow`). Being
    one statement, it is atomic by itself: the worker runs it in autocommit, one round
    trip in all.
    """
    filters = [
        f"status = '{QUEUED}'",
        "NOT cancel_requested",
        "next_run_at <= %(now)s",
        "attempt_count < max_attempts",
    ]
    if queues:
        filters.append(f"queue IN ({_in_list('queue', queues)})")
    if one_job:
        filters.append("scope_hash = %(scope_hash)s AND job_id = %(job_id)s")
    postgres = vendor == "postgresql"
    lock = " FOR UPDATE SKIP LOCKED" if postgres else ""
    # PostgreSQL: the chosen ids as an array, so that the update finds them by primary
    # key whatever the plan's row estimate (an IN sub-select may be planned as a
    # hash join over the whole table).
    chosen, close = ("= ANY(ARRAY", ")") if postgres else ("IN", "")
    guard = "NOT EXISTS (SELECT 1 FROM orphans) AND " if finishing else ""
    update = (
        f"UPDATE {JOB} SET status = '{RUNNING}', attempt_count = attempt_count + 1,"
        f" current_token = {random_token_sql(vendor)},"
        " leased_by = %(worker_id)s, lease_expires_at = %(lease_expires_at)s,"
        " started_at = %(now)s, updated_at = %(now)s,"
        " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
        " finished_at = NULL"
        f" WHERE {guard}id {chosen} (SELECT id FROM {JOB} WHERE {' AND '.join(filters)}"
        f" ORDER BY priority DESC, next_run_at, id LIMIT %(limit)s{lock}){close}"
        f" RETURNING {_CLAIM_RETURNING}"
    )
    if not postgres:
        return update
    ctes = (
        f"claimed AS ({update}),"
        f" attempts AS ({_ATTEMPT_INSERT} SELECT id, attempt, token, '{RUNNING}', leased_by,"
        " NULL, '', '', NULL, started_at, NULL FROM claimed)"
    )
    if not finishing:
        return f"WITH {ctes} SELECT {', '.join(_CLAIMED)} FROM claimed"
    return f"WITH {complete_ctes()}, {ctes} " + _union(
        [
            ("finished", "finished", _FINISHED_COLUMNS),
            ("claimed", "claimed", {name: name for name in _CLAIMED}),
            ("orphan", "orphans", _ORPHAN_COLUMNS),
        ]
    )


@functools.lru_cache(maxsize=64)
def insert_attempts(rows: int) -> str:
    """SQLite: the Running attempt rows of ``rows`` claimed jobs (:func:`numbered`
    ``job_id``, ``number``, ``token``), all started at ``now`` by ``worker_id``."""
    return f"{_ATTEMPT_INSERT} VALUES " + ", ".join(
        f"(%(job_id_{n})s, %(number_{n})s, %(token_{n})s, '{RUNNING}', %(worker_id)s,"
        " NULL, '', '', NULL, %(now)s, NULL)"
        for n in range(rows)
    )


def _union(branches: Sequence[tuple[str, str, Mapping[str, str]]]) -> str:
    """One result of several kinds of row: a ``kind`` column, then the union of every
    branch's named columns (NULL where a branch has none). A branch is its kind, the
    CTE its rows come from and its columns, ``{result name: expression}``; a union
    takes its column types from the branches before, so a branch with typed values
    should come first."""
    names: list[str] = []
    for _, _, columns in branches:
        names.extend(name for name in columns if name not in names)
    return " UNION ALL ".join(
        f"SELECT '{kind}'{' AS kind' if n == 0 else ''}, "
        + ", ".join(_column(columns.get(name, "NULL"), name if n == 0 else None) for name in names)
        + f" FROM {source}"
        for n, (kind, source, columns) in enumerate(branches)
    )


def _column(expression: str, name: str | None) -> str:
    """``expression AS name`` (just ``expression`` without a name, or if it is one)."""
    return expression if name is None or name == expression else f"{expression} AS {name}"


# --------------------------------------------------------------------------- finishing


class FinishedRow(TypedDict):
    """A row of :func:`complete_ctes`: a finished attempt (``kind`` ``'finished'``) or
    a token whose job has no Running attempt row (``'orphan'``; the rest is NULL)."""

    kind: str
    token: str
    status: str | None
    attempt_finished: bool | None


_FINISHED_COLUMNS = {
    "token": "token",
    "status": "status",
    "attempt_finished": "token IN (SELECT token FROM finished_attempts)",
}
_ORPHAN_COLUMNS = {"token": "token"}


@functools.lru_cache(maxsize=8)
def finish_job(*, lease_guard: bool, owner_guard: bool) -> str:
    """J8 for one attempt: the job's guarded update (``token`` current, Running; with
    ``lease_guard``, ``lease_expires_at`` before ``lease_expired_before``; with
    ``owner_guard``, leased by ``leased_by``). The job row's cancel flag decides
    between ``cancelled`` and ``status``; ``result_ref`` is dropped when cancelled.
    Also ``error`` and ``now``. Returns the job's ``id``, final ``status`` and ``queue``.
    """
    guards = ["current_token = %(token)s", f"status = '{RUNNING}'"]
    if lease_guard:
        guards.append("lease_expires_at < %(lease_expired_before)s")
    if owner_guard:
        guards.append("leased_by = %(leased_by)s")
    return (
        f"UPDATE {JOB} SET"
        f" status = CASE WHEN cancel_requested THEN '{CANCELLED}' ELSE %(status)s END,"
        " result_ref = CASE WHEN cancel_requested THEN NULL ELSE %(result_ref)s END,"
        " error = %(error)s, finished_at = %(now)s, updated_at = %(now)s,"
        " current_token = NULL, leased_by = '', lease_expires_at = NULL"
        f" WHERE {' AND '.join(guards)}"
        " RETURNING id, status, queue"
    )


def complete_ctes() -> str:
    """PostgreSQL: ``complete`` of a batch of attempts as CTEs. Parameters: ``tokens``
    and their ``results`` as two arrays, ``now``.

    Per row, the guard of :func:`finish_job` — the token is current and the job
    Running; the job row's own cancel flag decides Succeeded or Cancelled — plus the
    attempt row, which changes in the same statement. ``orphans`` are the tokens whose
    job is Running under them but whose Running attempt row is missing: if there is
    one, nothing in the statement changes anything (J8: the whole transition fails).
    The batch travels as arrays, so the statement's text is the same whatever its size
    and is prepared once; the tokens travel again as a plain array, which a plan can
    look up in the token index whatever its row estimate for the unnest.
    """
    return (
        "done AS (SELECT * FROM unnest(%(tokens)s::text[], %(results)s::text[])"
        " AS d(token, result_ref)),"
        f" orphans AS (SELECT done.token FROM done JOIN {JOB} AS j"
        " ON j.current_token = done.token"
        f" WHERE j.current_token = ANY(%(tokens)s::text[]) AND j.status = '{RUNNING}'"
        f" AND NOT EXISTS (SELECT 1 FROM {ATTEMPT} AS a WHERE a.job_id = j.id"
        f" AND a.token = done.token AND a.status = '{RUNNING}')),"
        f" finished AS (UPDATE {JOB} AS j SET"
        f" status = CASE WHEN j.cancel_requested THEN '{CANCELLED}' ELSE '{SUCCEEDED}' END,"
        " result_ref = CASE WHEN j.cancel_requested THEN NULL ELSE done.result_ref END,"
        " error = '', finished_at = %(now)s, updated_at = %(now)s,"
        " current_token = NULL, leased_by = '', lease_expires_at = NULL"
        f" FROM done, {ATTEMPT} AS a"
        " WHERE j.current_token = ANY(%(tokens)s::text[]) AND j.current_token = done.token"
        f" AND j.status = '{RUNNING}'"
        f" AND a.job_id = j.id AND a.token = done.token AND a.status = '{RUNNING}'"
        " AND NOT EXISTS (SELECT 1 FROM orphans)"
        " RETURNING j.id, done.token, j.status, j.result_ref),"
        f" finished_attempts AS (UPDATE {ATTEMPT} AS a SET status = finished.status,"
        " result_ref = finished.result_ref, error = '', finished_at = %(now)s"
        " FROM finished WHERE a.job_id = finished.id AND a.token = finished.token"
        f" AND a.status = '{RUNNING}' RETURNING a.token)"
    )


@functools.lru_cache(maxsize=64)
def complete_jobs(rows: int) -> str:
    """SQLite: ``complete`` of ``rows`` jobs (:func:`numbered` ``token``,
    ``result_ref``) at ``now``, each guarded as by :func:`finish_job`. Returns each
    finished job's ``id``, ``scope_hash``, ``job_id`` and final ``status``."""
    return (
        "WITH done(token, result_ref)"
        f" AS (VALUES {_numbered_values(('token', 'result_ref'), rows)})"
        f" UPDATE {JOB} AS j SET"
        f" status = CASE WHEN j.cancel_requested THEN '{CANCELLED}' ELSE '{SUCCEEDED}' END,"
        " result_ref = CASE WHEN j.cancel_requested THEN NULL ELSE done.result_ref END,"
        " error = '', finished_at = %(now)s, updated_at = %(now)s,"
        " current_token = NULL, leased_by = '', lease_expires_at = NULL"
        f" FROM done WHERE j.current_token = done.token AND j.status = '{RUNNING}'"
        # SQLite: RETURNING names the updated table's columns unqualified.
        " RETURNING id, scope_hash, job_id, status"
    )


@functools.lru_cache(maxsize=64)
def complete_attempts(rows: int) -> str:
    """SQLite: the Running attempt rows of the jobs :func:`complete_jobs` finished
    (:func:`numbered` ``job_pk``, ``token``, ``status``, ``result_ref``), finished at
    ``now``. Returns each updated attempt's ``token``."""
    names = ("job_pk", "token", "status", "result_ref")
    return (
        f"WITH done({', '.join(names)}) AS (VALUES {_numbered_values(names, rows)})"
        f" UPDATE {ATTEMPT} AS a SET status = done.status, result_ref = done.result_ref,"
        " error = '', finished_at = %(now)s"
        f" FROM done WHERE a.job_id = done.job_pk AND a.token = done.token"
        f" AND a.status = '{RUNNING}' RETURNING token"
    )


# --------------------------------------------------------------------------- progress


#: J7: the job's progress (``progress``, ``message``) at ``now``, only while ``token``
#: is current, the job Running, no cancel requested and ``progress`` not below the
#: stored value. Returns the job's ``id``.
REPORT_PROGRESS = (
    f"UPDATE {JOB} SET progress = %(progress)s, progress_message = %(message)s,"
    " updated_at = %(now)s"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}' AND NOT cancel_requested"
    " AND (progress IS NULL OR progress <= %(progress)s) RETURNING id"
)


@functools.lru_cache(maxsize=64)
def renew_leases(tokens: int) -> str:
    """A worker's heartbeat: ``lease_expires_at`` for its Running jobs (leased by
    ``worker_id``) among ``tokens`` tokens (``token_0``…, see :func:`in_list_params`).
    Returns each renewed job's ``token`` and ``cancel_requested``."""
    return (
        f"UPDATE {JOB} SET lease_expires_at = %(lease_expires_at)s"
        f" WHERE status = '{RUNNING}' AND leased_by = %(worker_id)s"
        f" AND current_token IN ({_in_list('token', tokens)})"
        " RETURNING current_token AS token, cancel_requested"
    )


# --------------------------------------------------------------------------- retention


def oldest_finished(vendor: str) -> str:
    """The ``id`` of up to ``limit`` oldest finished jobs that finished before
    ``older_than``; on PostgreSQL, rows another transaction holds are skipped."""
    lock = " FOR UPDATE SKIP LOCKED" if vendor == "postgresql" else ""
    return (
        f"SELECT id FROM {JOB} WHERE status IN ({_FINISHED}) AND finished_at < %(older_than)s"
        f" ORDER BY finished_at LIMIT %(limit)s{lock}"
    )


@functools.lru_cache(maxsize=4)
def purge_finished(vendor: str) -> str:
    """Delete the jobs :func:`oldest_finished` chooses (same parameters), the status
    checked again by the delete itself.

    PostgreSQL: with their attempts, in one statement returning the number of jobs
    ``deleted``; the ids travel as arrays, for primary-key and (job, number) lookups
    whatever the plan's estimates, and the attempts' foreign key is checked at commit.
    SQLite: the jobs only, returning each deleted ``id``; :func:`delete_attempts`
    follows.
    """
    oldest = oldest_finished(vendor)
    if vendor == "postgresql":
        return (
            f"WITH gone AS (DELETE FROM {JOB} WHERE id = ANY(ARRAY({oldest}))"
            f" AND status IN ({_FINISHED}) RETURNING id),"
            f" attempts AS (DELETE FROM {ATTEMPT}"
            " WHERE job_id = ANY(ARRAY(SELECT id FROM gone)))"
            " SELECT count(*) AS deleted FROM gone"
        )
    return f"DELETE FROM {JOB} WHERE id IN ({oldest}) AND status IN ({_FINISHED}) RETURNING id"


@functools.lru_cache(maxsize=64)
def delete_attempts(jobs: int) -> str:
    """SQLite: the attempts of ``jobs`` deleted jobs (``job_0``…, see
    :func:`in_list_params`)."""
    return f"DELETE FROM {ATTEMPT} WHERE job_id IN ({_in_list('job', jobs)})"
