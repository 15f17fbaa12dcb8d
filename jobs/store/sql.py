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
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from ..db import in_list, numbered, random_token_sql, union_by_kind, values_of
from ..models import Job, JobAttempt, Lane, LimitCounter, Queue, ScopeWeight, UniqueHold
from ..types import FINISHED_STATUSES, Claim, JobStatus
from .sql_endings import ending_ctes

JOB = Job._meta.db_table
ATTEMPT = JobAttempt._meta.db_table
QUEUE = Queue._meta.db_table
COUNTER = LimitCounter._meta.db_table
LANE = Lane._meta.db_table
SCOPE_WEIGHT = ScopeWeight._meta.db_table
UNIQUE_HOLD = UniqueHold._meta.db_table

QUEUED = JobStatus.QUEUED.value
RUNNING = JobStatus.RUNNING.value
INTERRUPTED = JobStatus.INTERRUPTED.value
CANCELLED = JobStatus.CANCELLED.value
_FINISHED = ", ".join(f"'{status.value}'" for status in FINISHED_STATUSES)


# --------------------------------------------------------------------------- wake-ups


#: The guard of every claim on a job's own row: Queued, not held by its sequence, no
#: cancel requested, due, attempts left, its start deadline not passed.
DUE = (
    f"status = '{QUEUED}'",
    "NOT cancel_requested",
    # A job held behind an earlier one of its sequence is out of the claim's index.
    "NOT sequence_held",
    "next_run_at <= %(now)s",
    "attempt_count < max_attempts",
    "(start_by IS NULL OR start_by > %(now)s)",
)
#: The last guard of every claim: not in a paused queue (a paused queue has a row of
#: ``jobs_queue``).
UNPAUSED = f"queue NOT IN (SELECT name FROM {QUEUE} WHERE paused)"
#: The whole guard of every claim, on a job's row.
CLAIMABLE = (*DUE, UNPAUSED)


#: What a job gives up when it stops Running — finished, recovered, snoozed, put
#: back or released: its token and its lease. Every statement that leaves Running
#: sets these, as :data:`LEAVE_RUNNING`; the ORM's updates, as this mapping.
LEFT_RUNNING: Mapping[str, str | None] = {
    "current_token": None,
    "leased_by": "",
    "lease_expires_at": None,
}
#: :data:`LEFT_RUNNING` as assignments of an UPDATE's SET.
LEAVE_RUNNING = ", ".join(
    f"{column} = {'NULL' if value is None else repr(value)}"
    for column, value in LEFT_RUNNING.items()
)


# --------------------------------------------------------------------------- limit counters


def counter_changes(deltas: str) -> str:
    """PostgreSQL: add to each limit counter the ``n`` of ``deltas`` (a query of
    ``key``, ``n`` and ``cap``, one row per key), creating the counters it lacks. A
    count added sets the counter's ``cap`` (its limit: a counter past it fails the
    statement); a count given back keeps it. In key order: every statement that
    changes counters takes their row locks in one order, so no two of them
    deadlock."""
    return (
        f"INSERT INTO {COUNTER} AS c (key, running, cap) SELECT key, n, cap FROM ({deltas}) AS d"
        " WHERE n <> 0 ORDER BY key"
        " ON CONFLICT (key) DO UPDATE SET running = c.running + excluded.running,"
        " cap = CASE WHEN excluded.running > 0 THEN excluded.cap ELSE c.cap END"
    )


#: The constraint a counter taken past its ``cap`` fails on.
COUNTER_CAP = "jobs_limitcounter_within_cap"


def counted_keys(source: str) -> str:
    """PostgreSQL: one ``key`` row per counter each row of ``source`` (a CTE with
    ``limit_keys``) counts in."""
    return (
        f"SELECT k.key FROM {source} AS s, jsonb_array_elements_text(s.limit_keys::jsonb) AS k(key)"
    )


#: PostgreSQL: give back one count to each counter of ``limit_keys`` (a job's), as a
#: job leaves Running outside a finishing statement (snooze, put-back).
GIVE_BACK = counter_changes(
    "SELECT key, -1 AS n, NULL::bigint AS cap"
    " FROM jsonb_array_elements_text(%(limit_keys)s::jsonb) AS k(key)"
)


#: PostgreSQL: wake listeners (``channel``, ``payload``); delivered on commit.
NOTIFY = "SELECT pg_notify(%(channel)s, %(payload)s)"


# --------------------------------------------------------------------------- claiming


#: A Claim's fields that a claim returns by name (``token`` and ``attempt`` are the
#: job's new ``current_token`` and ``attempt_count``).
CLAIM_FIELDS = tuple(
    name
    for name in Claim.__dataclass_fields__
    if name not in ("worker_id", "lease_expires_at", "due_at", "started_at")
)
_CLAIM_EXPRESSIONS = {
    "token": "current_token",
    "attempt": "attempt_count",
    # Snoozed executions keep their attempt rows without counting as attempts; so do
    # claims released at a worker's shutdown and attempts recovered within the crash
    # budget.
    "number": "attempt_count + snooze_count + release_count + interruption_count",
}
#: The columns of each job a claim started: its primary key, :data:`CLAIM_FIELDS`, and
#: what claims are ordered by and attempt rows need (``number``: the attempt row's).
CLAIMED = (
    "id",
    *CLAIM_FIELDS,
    "number",
    "priority",
    "next_run_at",
    "fair_at",
    "leased_by",
    "started_at",
)
_CLAIM_RETURNING = ", ".join(
    f"{_CLAIM_EXPRESSIONS[name]} AS {name}" if name in _CLAIM_EXPRESSIONS else name
    for name in CLAIMED
)
_ATTEMPT_INSERT = (
    f"INSERT INTO {ATTEMPT} (job_id, number, token, status, worker_id, progress,"
    " progress_message, error, result_ref, started_at, finished_at)"
)


@functools.lru_cache(maxsize=64)
def claim(
    vendor: str,
    *,
    queues: int,
    one_job: bool,
    finishing: bool = False,
    chosen: int = 0,
    limited: bool = False,
) -> str:
    """The claim: one guarded UPDATE of up to ``limit`` due jobs, returning the
    :data:`CLAIMED` columns of each.

    Parameters: ``worker_id``, ``lease_expires_at``, ``now``, ``limit``; with
    ``queues``, ``queue_0``… (see :func:`jobs.db.in_list_params`); with ``one_job``,
    ``scope_hash`` and ``job_id``. With ``chosen`` (a claim under limits on
    SQLite; PostgreSQL's is :func:`jobs.store.sql_limits.limited_claim`), the jobs were
    chosen by :func:`jobs.store.sql_limits.candidates`: the update takes ``ids``
    (PostgreSQL, an array) or ``id_0``… (SQLite, ``chosen`` of them) instead of
    ``limit``, the same guard checked again. With ``limited`` (a claim under limits on
    SQLite), each job's ``limit_key`` and ``cost`` are returned too, for its rates.

    On PostgreSQL the same statement also inserts each claimed job's Running attempt
    row (a data-modifying CTE), so a claim is one round trip; on SQLite the attempt
    rows follow as a second statement of the same transaction
    (:func:`insert_attempts`). With ``finishing`` (PostgreSQL only), the statement
    also finishes a batch of attempts — the finishing rule of :func:`finish`, whose
    parameters it takes too; it runs after the claim (see :func:`claimed_kinds`) —
    and every row it returns has its ``kind``:
    ``'finished'`` or ``'orphan'`` (a :class:`FinishedRow`; with an orphan the
    statement changes nothing at all) or ``'claimed'`` (:data:`CLAIMED`). Being
    one statement, it is atomic by itself: the worker runs it in autocommit, one round
    trip in all.
    """
    postgres = vendor == "postgresql"
    guard = "NOT EXISTS (SELECT 1 FROM orphans) AND " if finishing else ""
    which = first_due(vendor, queues=queues, one_job=one_job)
    if chosen:
        filters = claim_filters(queues=queues, one_job=one_job)
        ids = "ANY(%(ids)s::bigint[])" if postgres else f"({in_list('id', chosen)})"
        which = f"id {'=' if postgres else 'IN'} {ids} AND {' AND '.join(filters)}"
    update = claim_update(vendor, f"{guard}{which}", counted="NULL" if limited else None)
    if not postgres:
        return update
    ctes = claimed_ctes(update)
    if not finishing:
        return f"WITH {ctes} SELECT {', '.join(CLAIMED)} FROM claimed"
    # The batch is the worker's own claims, made without limits as this one is: none
    # counts in a limit counter, so none has a count to give back.
    return f"WITH {_finish_ctes()}, {ctes} " + union_by_kind(claimed_kinds(finishing=True))


def claim_filters(*, queues: int, one_job: bool) -> list[str]:
    """A claim's guard (:data:`CLAIMABLE`), with ``queues`` queues (``queue_0``…) and
    with ``one_job`` (``scope_hash`` and ``job_id``)."""
    filters = list(CLAIMABLE)
    if queues:
        filters.append(f"queue IN ({in_list('queue', queues)})")
    if one_job:
        filters.append("scope_hash = %(scope_hash)s AND job_id = %(job_id)s")
    return filters


#: The claim order.
ORDER = "priority DESC, fair_at, id"


def _in_line(vendor: str) -> str:
    """The line index's predicate (``jobs_job_line_idx``): Queued and not held by its
    sequence — on SQLite in the very form of the index's, which its planner needs to
    use a partial index: in both forms, as Django 5.2 and 6.0 write the index's
    condition (``NOT sequence_held``) and as Django 6.1 does (``sequence_held = 0``)."""
    held = (
        "NOT sequence_held" if vendor == "postgresql" else "sequence_held = 0 AND NOT sequence_held"
    )
    return f"status = '{QUEUED}' AND {held}"


def _lines(vendor: str, queues: int, exclude: str) -> str:
    """The CTE ``lines``: the queues a claim takes from, a ``name`` per row — the
    ``queues`` named (``queue_0``…) or, with none, every queue with a job in line,
    found by a loose scan of the line index (one probe per queue, however many jobs
    each holds) —, less the paused queues and those ``exclude`` (a condition on
    ``l.name``) leaves out."""
    if queues:
        source = " UNION ".join(
            f"SELECT CAST(%(queue_{n})s AS varchar) AS name" for n in range(queues)
        )
    else:
        line = _in_line(vendor)
        first = f"SELECT queue FROM {JOB} WHERE {line} ORDER BY queue LIMIT 1"
        following = (
            f"SELECT queue FROM {JOB} WHERE {line} AND queue > q.name ORDER BY queue LIMIT 1"
        )
        source = (
            f"SELECT ({first}) AS name UNION ALL SELECT ({following}) FROM queues AS q"
            " WHERE q.name IS NOT NULL"
        )
    kept = f" AND {exclude}" if exclude else ""
    return (
        f"queues(name) AS ({source}),"
        f" lines AS (SELECT l.name FROM queues AS l WHERE l.name IS NOT NULL"
        f" AND l.name NOT IN (SELECT name FROM {QUEUE} WHERE paused){kept})"
    )


def in_line(
    vendor: str,
    *,
    queues: int,
    one_job: bool = False,
    columns: Sequence[str] = ("id",),
    filters: Sequence[str] = (),
    lock: bool = True,
    exclude: str = "",
) -> str:
    """A SELECT of ``columns`` of the first ``limit`` claimable jobs in claim order,
    ``filters`` (conditions on ``{JOB}``'s row) admitting them too, from the queues of
    :func:`_lines` (``queues``, ``exclude``). With ``one_job``, the job of that identity
    (``scope_hash``, ``job_id``) alone, through the identity's index.

    The scan is driven per queue: each queue's line is an index range of its own
    (``jobs_job_line_idx``, by queue, then priority and place in line), read from its
    head only as far as the claim needs, so that the jobs of a paused queue, of a queue
    the claim does not serve or that a limit closes cost it nothing, however many they
    are. The queues' heads are merged in claim order.

    PostgreSQL, with ``lock``: the rows are locked, skipping those another claim holds.
    A first pass, without locks, finds how many of the first ``limit`` jobs each queue
    holds; the second takes that many from each queue's head, locked (``SKIP
    LOCKED``), so that no row is locked that the claim does not take. Under concurrent
    claims the second pass may take a queue's later jobs where another claim holds its
    first ones: claim order holds within each queue, and across queues as the first
    pass saw them. SQLite locks nothing (its claims hold the write lock)."""
    postgres = vendor == "postgresql"
    tail = " FOR UPDATE SKIP LOCKED" if postgres and lock else ""
    if one_job:
        guard = " AND ".join([*claim_filters(queues=queues, one_job=True), *filters])
        return (
            f"SELECT {', '.join(columns)} FROM {JOB} WHERE {guard}"
            f" ORDER BY {ORDER} LIMIT %(limit)s{tail}"
        )
    guard = " AND ".join([*([] if postgres else [_in_line(vendor)]), *DUE, *filters])
    if postgres:
        # The time as a value of the statement's own (an init plan): a prepared claim's
        # generic plan and its custom ones then estimate the lines' reads alike, and the
        # generic one — planned once per connection — is the one PostgreSQL keeps.
        guard = guard.replace("%(now)s", "(SELECT CAST(%(now)s AS timestamptz))")
        limit = "(SELECT CAST(%(limit)s AS bigint))"
    else:
        limit = "%(limit)s"
    order = ", ".join(f"h.{name}" for name in ORDER.split(", "))
    ctes = f"WITH RECURSIVE {_lines(vendor, queues, exclude)}"

    def head(queue: str, limit: str, selected: Sequence[str], end: str = "") -> str:
        return (
            f"SELECT {', '.join(selected)} FROM {JOB} WHERE queue = {queue} AND {guard}"
            f" ORDER BY {ORDER} LIMIT {limit}{end}"
        )

    picked = ", ".join(f"h.{name}" for name in columns)
    if not postgres:
        return (
            f"{ctes} SELECT {picked} FROM lines AS l, {JOB} AS h"
            f" WHERE h.id IN ({head('l.name', '%(limit)s', ('id',))})"
            f" ORDER BY {order} LIMIT %(limit)s"
        )
    keys = ("queue", "priority", "fair_at", "id")
    first = (
        f"SELECT {', '.join(f'h.{name}' for name in keys) if lock else picked}"
        " FROM lines AS l CROSS JOIN LATERAL"
        f" ({head('l.name', limit, sorted({*columns, *keys}))}) AS h"
        f" ORDER BY {order} LIMIT {limit}"
    )
    if not lock:
        return f"{ctes} {first}"
    return (
        f"{ctes}, firsts AS ({first}),"
        " shares AS (SELECT queue AS name, count(*) AS n FROM firsts GROUP BY queue)"
        f" SELECT {picked} FROM shares AS s CROSS JOIN LATERAL"
        f" ({head('s.name', 's.n', columns, tail)}) AS h"
    )


def first_due(
    vendor: str,
    *,
    queues: int,
    one_job: bool,
    filters: Sequence[str] = (),
    exclude: str = "",
) -> str:
    """``id`` is among the first ``limit`` claimable jobs in claim order, ``filters``
    admitting them too, locked (:func:`in_line`). On PostgreSQL the pick runs once for
    the whole statement, as :func:`ledon.db.id_among_locked` says why."""
    select = in_line(vendor, queues=queues, one_job=one_job, filters=filters, exclude=exclude)
    return f"id = ANY(ARRAY({select}))" if vendor == "postgresql" else f"id IN ({select})"


def claim_update(vendor: str, where: str, counted: str | None = None) -> str:
    """The claim's UPDATE of the jobs ``where`` selects (the guard included),
    returning the :data:`CLAIMED` columns of each (see :func:`claim`). With
    ``counted`` (a claim under limits), each job's ``limit_keys`` is that expression,
    returned too, with its ``limit_key`` and ``cost``. Without, the claim is the one it
    always was: ``limit_keys`` is NULL already, since every way back to Queued clears
    it."""
    return (
        f"UPDATE {JOB} SET status = '{RUNNING}', attempt_count = attempt_count + 1,"
        f" current_token = {random_token_sql(vendor)},"
        " leased_by = %(worker_id)s, lease_expires_at = %(lease_expires_at)s,"
        " started_at = %(now)s, updated_at = %(now)s,"
        " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
        " finished_at = NULL"
        + (f", limit_keys = {counted}" if counted else "")
        + f" WHERE {where}"
        + f" RETURNING {_CLAIM_RETURNING}{_LIMITED_RETURNING if counted else ''}"
    )


#: What a claim under limits returns of each job beyond :data:`CLAIMED`: the counters it
#: counts in, and what its rates are counted by.
_LIMITED_RETURNING = ", limit_keys, limit_key, cost"


def claimed_ctes(update: str) -> str:
    """PostgreSQL: the CTEs ``claimed`` (``update``, a :func:`claim_update`) and
    ``attempts``, the Running attempt row of each claimed job."""
    return (
        f"claimed AS ({update}),"
        f" attempts AS ({_ATTEMPT_INSERT} SELECT id, number, token, '{RUNNING}', leased_by,"
        " NULL, '', '', NULL, started_at, NULL FROM claimed)"
    )


def claimed_kinds(*, finishing: bool) -> list[tuple[str, str, Mapping[str, str]]]:
    """The :func:`jobs.db.union_by_kind` branches of a claim's rows: ``'claimed'``,
    and with ``finishing`` ``'finished'`` and ``'orphan'`` (see :func:`claim`)."""
    claimed = ("claimed", "claimed", {name: name for name in CLAIMED})
    if not finishing:
        return [claimed]
    # The claim first: a statement runs its data-modifying CTEs in the order its
    # result reads them, and the sooner after the statement's snapshot the claim
    # locks its jobs, the fewer jobs it meets that another claim took meanwhile. Its
    # lock follows each of those to the job's newest version (Running) and holds it
    # to the commit, though the job no longer qualifies — and the finish of that job
    # by its own worker waits for it.
    return [
        claimed,
        ("finished", "finished", _FINISHED_COLUMNS),
        ("orphan", "orphans", _ORPHAN_COLUMNS),
    ]


def finish_ctes() -> str:
    """PostgreSQL: the finishing rule for a batch as CTEs (see :func:`_finish_ctes`), for a
    statement that finishes and claims under limits: it gives the finished jobs' counts
    back itself, in the one change of each counter it makes."""
    return _finish_ctes()


@functools.lru_cache(maxsize=64)
def insert_attempts(rows: int) -> str:
    """SQLite: the Running attempt rows of ``rows`` claimed jobs (:func:`jobs.db.numbered`
    ``job_id``, ``number``, ``token``), all started at ``now`` by ``worker_id``."""
    return f"{_ATTEMPT_INSERT} VALUES " + ", ".join(
        f"(%(job_id_{n})s, %(number_{n})s, %(token_{n})s, '{RUNNING}', %(worker_id)s,"
        " NULL, '', '', NULL, %(now)s, NULL)"
        for n in range(rows)
    )


# --------------------------------------------------------------------------- finishing
#
# The finishing rule, once, for every way an attempt ends — complete, fail, interrupt,
# recover; one attempt or a batch; alone or before a claim; on both databases. Per
# attempt of the batch (a ``done`` row: its ``token``, ``outcome`` — the job's status
# should no cancel be requested —, ``result_ref`` and ``error``):
#
# - the token is current and the job Running (recovery may add a lease guard);
# - the job row's own cancel flag decides Cancelled or the outcome, and a Cancelled
#   job keeps no result;
# - the attempt row ends in the same transaction: Cancelled, unless the outcome is
#   Interrupted, which an interrupted attempt stays;
# - a job Running under its token without a Running attempt row fails the whole
#   transition, which changes nothing (AttemptRowMissing).
#
# PostgreSQL finishes the batch in one statement (data-modifying CTEs, alone or inside
# the claim); SQLite, which has none, in two statements of one transaction.


#: The values of one finishing attempt, as named in a batch (``done`` rows): the
#: attempt keeps its ``error`` whole, the job its ``summary`` (see
#: :func:`jobs.validation.job_error_summary`), so the text is stored once.
FINISHING = ("token", "outcome", "result_ref", "error", "summary")
#: PostgreSQL: the batch as one array parameter per value, so that the statement's
#: text is the same whatever the batch's size and is prepared once.
_FINISHING_ARRAYS = {
    "token": "tokens",
    "outcome": "outcomes",
    "result_ref": "results",
    "error": "errors",
    "summary": "summaries",
}


def finishing_params(vendor: str, batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of a batch of ``done`` rows (each keyed by :data:`FINISHING`)."""
    if vendor == "postgresql":
        return {array: [row[name] for row in batch] for name, array in _FINISHING_ARRAYS.items()}
    return numbered(batch)


def _kept_result(cancel: str, done: str = "done") -> str:
    return f"CASE WHEN {cancel} THEN NULL ELSE {done}.result_ref END"


def _finished_job_set() -> str:
    """The job row's end: the SET of an UPDATE of ``j`` from ``done``."""
    return (
        f"status = CASE WHEN j.cancel_requested THEN '{CANCELLED}' ELSE done.outcome END,"
        f" result_ref = {_kept_result('j.cancel_requested')},"
        " error = done.summary, finished_at = %(now)s, updated_at = %(now)s,"
        f" {LEAVE_RUNNING}"
    )


def _finished_attempt_set(cancel: str, done: str = "done") -> str:
    """The attempt row's end, ``cancel`` being its job's cancel flag and ``done`` the
    row with its batch values."""
    return (
        f"status = CASE WHEN {cancel} AND {done}.outcome <> '{INTERRUPTED}'"
        f" THEN '{CANCELLED}' ELSE {done}.outcome END,"
        f" result_ref = {_kept_result(cancel, done)}, error = {done}.error,"
        " finished_at = %(now)s"
    )


def _job_guard(*, lease_guard: bool, owner_guard: bool) -> str:
    """``j`` is Running under ``done.token``; with ``lease_guard``, its lease expired
    before ``lease_expired_before``; with ``owner_guard``, it is leased by
    ``leased_by`` (recovery never robs a live worker)."""
    guard = f"j.current_token = done.token AND j.status = '{RUNNING}'"
    if lease_guard:
        guard += " AND j.lease_expires_at < %(lease_expired_before)s"
    if owner_guard:
        guard += " AND j.leased_by = %(leased_by)s"
    return guard


#: The Running attempt row ``a`` of the job ``j`` under ``done.token``.
_RUNNING_ATTEMPT = f"a.job_id = j.id AND a.token = done.token AND a.status = '{RUNNING}'"


class FinishedRow(TypedDict):
    """A row of a PostgreSQL finishing statement: a finished attempt (``kind``
    ``'finished'``: its job's ``id``, final ``status`` and ``queue``, whether its
    attempt row changed, and what its batch and sequence need: its identity, handler,
    ``batch_id`` and ``sequence_key``), or a token whose job is Running under it
    without a Running attempt row (``'orphan'``; only ``token`` is set)."""

    kind: str
    token: str
    id: int | None
    status: str | None
    queue: str | None
    attempt_finished: bool | None
    scope_hash: str | None
    job_id: str | None
    handler: str | None
    batch_id: str | None
    sequence_key: str | None


#: What a finished job tells its batch and sequence (see :mod:`jobs.store.endings`).
_ENDING_EXTRA = ("scope_hash", "job_id", "handler", "batch_id", "sequence_key")

_FINISHED_COLUMNS = {
    "token": "token",
    "id": "id",
    "status": "status",
    "queue": "queue",
    "attempt_finished": "token IN (SELECT token FROM finished_attempts)",
    **{name: name for name in _ENDING_EXTRA},
}
_ORPHAN_COLUMNS = {"token": "token"}


#: The final statuses a finish re-queues in the same transaction when asked to
#: (``requeue``: an automatic retry), attempts and cancel permitting. A recovery
#: re-queues under the crash budget instead (``jobs.store.recovering``).
REQUEUED_ENDINGS = (JobStatus.FAILED,)


def requeued(job: str) -> str:
    """Whether the finished job ``job`` (a row with ``status``, ``cancel_requested``,
    ``attempt_count`` and ``max_attempts``) is one a finish re-queues when asked to: the
    ORM's guard of :func:`jobs.store.finishing.finish_batch`, in SQL."""
    statuses = ", ".join(f"'{status.value}'" for status in REQUEUED_ENDINGS)
    return (
        f"({job}.status IN ({statuses}) AND NOT {job}.cancel_requested"
        f" AND {job}.attempt_count < {job}.max_attempts)"
    )


def _finish_ctes(
    *, lease_guard: bool = False, owner_guard: bool = False, give_back: bool = False
) -> str:
    """PostgreSQL: the finishing rule for a batch (:func:`finishing_params` and ``now``, and
    the guards' parameters) as CTEs: ``finished`` jobs, ``finished_attempts``, and the
    ``orphans`` — if there is one, nothing in the statement changes anything. The
    tokens also travel as a plain array, which a plan can look up in the token index
    whatever its row estimate for the unnest. With ``give_back``, the finished jobs'
    counts go back to their limit counters (``given_back``)."""
    guard = _job_guard(lease_guard=lease_guard, owner_guard=owner_guard)
    given_back = ""
    if give_back:
        given_back = (
            ", given_back AS ("
            + counter_changes(
                f"SELECT key, -count(*) AS n, NULL::bigint AS cap"
                f" FROM ({counted_keys('finished')}) AS u GROUP BY key"
            )
            + ")"
        )
    arrays = ", ".join(f"%({array})s::text[]" for array in _FINISHING_ARRAYS.values())
    return (
        f"done AS (SELECT * FROM unnest({arrays}) AS d({', '.join(FINISHING)})),"
        f" orphans AS (SELECT done.token FROM done JOIN {JOB} AS j"
        " ON j.current_token = done.token"
        f" WHERE j.current_token = ANY(%(tokens)s::text[]) AND {guard}"
        f" AND NOT EXISTS (SELECT 1 FROM {ATTEMPT} AS a WHERE {_RUNNING_ATTEMPT})),"
        f" finished AS (UPDATE {JOB} AS j SET {_finished_job_set()}"
        f" FROM done, {ATTEMPT} AS a"
        f" WHERE j.current_token = ANY(%(tokens)s::text[]) AND {guard}"
        f" AND {_RUNNING_ATTEMPT} AND NOT EXISTS (SELECT 1 FROM orphans)"
        # With the batch's values, so that the attempts' update needs no second join.
        " RETURNING j.id, j.status, j.queue, j.cancel_requested, j.limit_keys, done.token,"
        " done.outcome, done.result_ref, done.error, "
        + ", ".join(f"j.{name}" for name in _ENDING_EXTRA)
        + ", j.attempt_count, j.max_attempts),"
        f" finished_attempts AS (UPDATE {ATTEMPT} AS a"
        f" SET {_finished_attempt_set('finished.cancel_requested', 'finished')}"
        " FROM finished WHERE a.job_id = finished.id AND a.token = finished.token"
        f" AND a.status = '{RUNNING}' RETURNING a.token)"
        f"{given_back},"
        # What follows in their batches and sequences; a job re-queued in the same
        # transaction (``requeue``: an automatic retry) is not final and moves nothing.
        f" ending AS (SELECT scope_hash, batch_id, sequence_key, '{RUNNING}' AS was,"
        f" CASE WHEN %(requeue)s AND {requeued('finished')} THEN '{QUEUED}' ELSE status END"
        " AS status FROM finished),"
        f" {ending_ctes('ending')}"
    )


@functools.lru_cache(maxsize=8)
def finish(*, lease_guard: bool = False, owner_guard: bool = False) -> str:
    """PostgreSQL: finish a batch in one statement (see :func:`_finish_ctes`),
    returning a :class:`FinishedRow` per finished attempt and per orphan."""
    ctes = _finish_ctes(lease_guard=lease_guard, owner_guard=owner_guard, give_back=True)
    return f"WITH {ctes} " + union_by_kind(
        [("finished", "finished", _FINISHED_COLUMNS), ("orphan", "orphans", _ORPHAN_COLUMNS)]
    )


def _sqlite_done(rows: int) -> str:
    return f"WITH done({', '.join(FINISHING)}) AS (VALUES {values_of(FINISHING, rows)})"


@functools.lru_cache(maxsize=64)
def finish_attempts_sqlite(
    rows: int, *, lease_guard: bool = False, owner_guard: bool = False
) -> str:
    """SQLite, first of two: end the Running attempt rows of the batch (``rows`` of
    :func:`finishing_params`, ``now``, the guards' parameters) whose job is Running
    under their token, reading the job's cancel flag. Returns each changed attempt's
    ``job_pk`` and ``token``."""
    guard = _job_guard(lease_guard=lease_guard, owner_guard=owner_guard)
    return (
        f"{_sqlite_done(rows)} UPDATE {ATTEMPT} AS a"
        f" SET {_finished_attempt_set('j.cancel_requested')}"
        f" FROM done, {JOB} AS j WHERE {_RUNNING_ATTEMPT} AND {guard}"
        # SQLite: RETURNING names the updated table's columns, unqualified.
        " RETURNING job_id AS job_pk, token"
    )


@functools.lru_cache(maxsize=64)
def finish_jobs_sqlite(rows: int, *, lease_guard: bool = False, owner_guard: bool = False) -> str:
    """SQLite, second of two, same parameters: end the jobs of the batch Running under
    their token. Returns each finished job's ``id``, final ``status`` and ``queue``;
    a job whose attempt the first statement did not change has no Running attempt
    row, and the transaction must be rolled back."""
    guard = _job_guard(lease_guard=lease_guard, owner_guard=owner_guard)
    return (
        f"{_sqlite_done(rows)} UPDATE {JOB} AS j SET {_finished_job_set()}"
        f" FROM done WHERE {guard} RETURNING id, status, queue, {', '.join(_ENDING_EXTRA)}"
    )


# --------------------------------------------------------------------------- progress


#: The job's progress (``progress``, ``message``) at ``now``, only while ``token``
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
    ``worker_id``) among ``tokens`` tokens (``token_0``…, see :func:`jobs.db.in_list_params`).
    Returns each renewed job's ``token`` and ``cancel_requested``."""
    return (
        f"UPDATE {JOB} SET lease_expires_at = %(lease_expires_at)s"
        f" WHERE status = '{RUNNING}' AND leased_by = %(worker_id)s"
        f" AND current_token IN ({in_list('token', tokens)})"
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
    return f"DELETE FROM {ATTEMPT} WHERE job_id IN ({in_list('job', jobs)})"
