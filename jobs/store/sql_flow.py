"""The raw SQL of snoozes, flow control and put-backs (J17, J18, J19), as named builders in
the manner of :mod:`jobs.store.sql`: named parameters, named result columns, the
PostgreSQL and SQLite forms side by side, cached texts.

None of these runs in a claim that no limit applies to: that claim is the one
statement of :func:`jobs.store.sql.claim`.
"""

from __future__ import annotations

import functools

from ..db import in_list, values_of
from ..models import ClaimStart
from ..types import JobStatus
from .sql import ATTEMPT, CANCELLED, CLAIMABLE, JOB, QUEUE, QUEUED, RUNNING

CLAIM_START = ClaimStart._meta.db_table
SNOOZED = "snoozed"

# --------------------------------------------------------------------------- limits (J18)

#: PostgreSQL: take the transaction-scoped advisory lock of every ``keys`` (a bigint
#: array, sorted: every claimer takes them in the same order, so none deadlocks).
#: ``unnest`` yields them in array order; each lock waits for the transaction holding
#: it to end.
LOCK_KEYS = "SELECT count(pg_advisory_xact_lock(k)) AS locked FROM unnest(%(keys)s::bigint[]) AS k"


@functools.lru_cache(maxsize=64)
def usage(handlers: int, queues: int, rate_keys: int, leaving: int = 0) -> str:
    """What limits count, in one statement: rows of ``kind`` ``'running'`` — the
    Running jobs of ``handlers`` limited handler names (``lim_handler_0``…) or
    ``queues`` limited queues (``lim_queue_0``…), per ``handler``, ``queue`` and ``scope_hash``, in
    ``n`` — and rows of ``kind`` ``'started'`` — per rate key (``key_0``…), in ``n``,
    the starts after its window's start (``since_0``…). Jobs Running under the
    ``leaving`` tokens (``leaving_0``…) are left out: the same transaction finishes
    them. Only Running jobs hold a current token: the small partial index of tokens
    serves the first part, the (key, started_at) index each term of the second."""
    either = []
    if handlers:
        either.append(f"handler IN ({in_list('lim_handler', handlers)})")
    if queues:
        either.append(f"queue IN ({in_list('lim_queue', queues)})")
    gone = f" AND current_token NOT IN ({in_list('leaving', leaving)})" if leaving else ""
    running = (
        "SELECT 'running' AS kind, handler, queue, scope_hash, NULL AS key, count(*) AS n"
        f" FROM {JOB} WHERE current_token IS NOT NULL AND status = '{RUNNING}'{gone}"
        f" AND ({' OR '.join(either)}) GROUP BY handler, queue, scope_hash"
    )
    if not rate_keys:
        return running
    terms = " OR ".join(
        f"(key = %(key_{n})s AND started_at > %(since_{n})s)" for n in range(rate_keys)
    )
    return (
        f"{running} UNION ALL SELECT 'started', NULL, NULL, NULL, key, count(*)"
        f" FROM {CLAIM_START} WHERE {terms} GROUP BY key"
    )


@functools.lru_cache(maxsize=256)
def candidates(
    vendor: str,
    *,
    queues: int,
    one_job: bool,
    full_handlers: int,
    full_queues: int,
    full_handler_scopes: int,
    full_queue_scopes: int,
    seen: int = 0,
) -> str:
    """Due jobs a claim under limits may take, in claim order, up to ``limit``: the
    guard of every claim, minus the handlers (``fh_0``…) and queues (``fq_0``…) at a
    limit and the (handler, scope) and (queue, scope) pairs at a per-scope limit
    (``fhs_k_0``/``fhs_s_0``…, ``fqs_k_0``/``fqs_s_0``…), and the ``seen`` jobs an
    earlier page returned (``seen_0``…). Returns each job's ``id``,
    ``handler``, ``queue`` and ``scope_hash``. PostgreSQL locks the rows it returns,
    skipping rows other claims hold."""
    filters = list(CLAIMABLE)
    if queues:
        filters.append(f"queue IN ({in_list('queue', queues)})")
    if one_job:
        filters.append("scope_hash = %(scope_hash)s AND job_id = %(job_id)s")
    if full_handlers:
        filters.append(f"handler NOT IN ({in_list('fh', full_handlers)})")
    if full_queues:
        filters.append(f"queue NOT IN ({in_list('fq', full_queues)})")
    for column, prefix, count in (
        ("handler", "fhs", full_handler_scopes),
        ("queue", "fqs", full_queue_scopes),
    ):
        if count:
            pairs = " OR ".join(
                f"({column} = %({prefix}_k_{n})s AND scope_hash = %({prefix}_s_{n})s)"
                for n in range(count)
            )
            filters.append(f"NOT ({pairs})")
    if seen:
        filters.append(f"id NOT IN ({in_list('seen', seen)})")
    lock = " FOR UPDATE SKIP LOCKED" if vendor == "postgresql" else ""
    return (
        f"SELECT id, handler, queue, scope_hash FROM {JOB} WHERE {' AND '.join(filters)}"
        f" ORDER BY priority DESC, next_run_at, id LIMIT %(limit)s{lock}"
    )


@functools.lru_cache(maxsize=64)
def insert_claim_starts(rows: int) -> str:
    """One row per rate-limited start (``key_0``…), all at ``now``."""
    return f"INSERT INTO {CLAIM_START} (key, started_at) VALUES " + values_of(
        ["key"], rows, ", %(now)s"
    )


#: Starts older than ``before`` (every window ended before it, with a margin).
PRUNE_CLAIM_STARTS = f"DELETE FROM {CLAIM_START} WHERE started_at < %(before)s"


# --------------------------------------------------------------------------- pause (J18)


#: Pause queue ``name`` at ``now`` — a new row, or a resumed one paused again.
#: Returns the ``name`` if it was not paused already.
PAUSE_QUEUE = (
    f"INSERT INTO {QUEUE} (name, paused, paused_at, updated_at)"
    " VALUES (%(name)s, TRUE, %(now)s, %(now)s)"
    " ON CONFLICT (name) DO UPDATE SET paused = TRUE, paused_at = excluded.paused_at,"
    f" updated_at = excluded.updated_at WHERE NOT {QUEUE}.paused RETURNING name"
)

#: Resume queue ``name`` at ``now``; returns the ``name`` if it was paused.
RESUME_QUEUE = (
    f"UPDATE {QUEUE} SET paused = FALSE, paused_at = NULL, updated_at = %(now)s"
    " WHERE name = %(name)s AND paused RETURNING name"
)


# --------------------------------------------------------------------------- snooze (J17)


#: J17: queue the job Running under ``token`` again at ``run_at`` (``now``), unless a
#: cancel request committed first; the execution is taken back from
#: ``attempt_count`` and counted in ``snooze_count`` instead. Returns the job's
#: ``id`` and ``queue``.
SNOOZE_JOB = (
    f"UPDATE {JOB} SET status = '{QUEUED}', next_run_at = %(run_at)s,"
    " attempt_count = attempt_count - 1, snooze_count = snooze_count + 1,"
    " current_token = NULL, leased_by = '', lease_expires_at = NULL, started_at = NULL,"
    " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
    " finished_at = NULL, handler_unknown_since = NULL, updated_at = %(now)s"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}' AND NOT cancel_requested"
    " RETURNING id, queue"
)

#: J17: the snoozed job's (``job``) Running attempt row under ``token`` ends Snoozed
#: with ``note``. Returns its ``id``.
SNOOZE_ATTEMPT = (
    f"UPDATE {ATTEMPT} SET status = '{SNOOZED}', finished_at = %(now)s, error = %(note)s"
    f" WHERE job_id = %(job)s AND token = %(token)s AND status = '{RUNNING}' RETURNING id"
)


# --------------------------------------------------------------------------- put back (J19)


#: J19: undo the claim under ``token`` (job Running) — the attempt count goes back
#: down — and decide: a cancel request that committed first ends the job Cancelled;
#: once the job's first such claim (``handler_unknown_since``, set by the first) is at
#: or before ``window_start`` it ends Failed with ``failed``; else it is Queued again at
#: ``run_at``, with ``waiting`` as its error. Returns the job's new ``status``.
_OVER = "COALESCE(handler_unknown_since, %(now)s) <= %(window_start)s"
PUT_BACK_UNKNOWN_HANDLER = (
    f"UPDATE {JOB} SET"
    f" status = CASE WHEN cancel_requested THEN '{CANCELLED}'"
    f" WHEN {_OVER} THEN '{JobStatus.FAILED.value}' ELSE '{QUEUED}' END,"
    f" finished_at = CASE WHEN cancel_requested OR {_OVER} THEN %(now)s ELSE NULL END,"
    f" next_run_at = CASE WHEN cancel_requested OR {_OVER} THEN next_run_at ELSE %(run_at)s END,"
    f" error = CASE WHEN cancel_requested THEN '' WHEN {_OVER} THEN %(failed)s"
    " ELSE %(waiting)s END,"
    " handler_unknown_since = COALESCE(handler_unknown_since, %(now)s),"
    " attempt_count = attempt_count - 1, updated_at = %(now)s,"
    " current_token = NULL, leased_by = '', lease_expires_at = NULL,"
    " started_at = NULL, progress = NULL, progress_message = '', result_ref = NULL"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}'"
    " RETURNING status"
)
