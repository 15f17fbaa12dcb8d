"""The raw SQL of snoozes, releases, recoveries, flow control and put-backs, as named
builders in the manner of :mod:`jobs.store.sql`: named parameters, named result
columns, the PostgreSQL and SQLite forms side by side, cached texts.

None of these runs in a claim that no limit applies to: that claim is the one
statement of :func:`jobs.store.sql.claim`. A claim under limits is
:data:`LOCK_KEYS` then :func:`limited_claim` on PostgreSQL, and :func:`usage`,
:func:`candidates` and :func:`insert_claim_starts` around the plain claim on SQLite.
"""

from __future__ import annotations

import functools

from ledon.db import id_among_locked

from ..db import in_list, union_by_kind, values_of
from ..models import ClaimStart
from ..types import JobStatus
from .sql import (
    ATTEMPT,
    CANCELLED,
    CLAIMABLE,
    COUNTER,
    INTERRUPTED,
    JOB,
    LEAVE_RUNNING,
    QUEUE,
    QUEUED,
    RUNNING,
    claim_filters,
    claim_update,
    claimed_ctes,
    claimed_kinds,
    counted_keys,
    counter_changes,
    finish_ctes,
    first_due,
)
from .sql_endings import ENDING_COLUMNS

CLAIM_START = ClaimStart._meta.db_table
SNOOZED = "snoozed"

# --------------------------------------------------------------------------- limits

#: PostgreSQL: take the transaction-scoped advisory lock of every ``keys`` (a bigint
#: array, sorted: every claimer takes them in the same order, so none deadlocks).
#: ``unnest`` yields them in array order; each lock waits for the transaction holding
#: it to end.
LOCK_KEYS = "SELECT count(pg_advisory_xact_lock(k)) AS locked FROM unnest(%(keys)s::bigint[]) AS k"


#: One limited key of a claim under limits: its kind (``"h"``, a handler name, or
#: ``"q"``, a queue) and which of ``max_running``, ``max_running_per_scope``,
#: ``rate`` and ``max_running_per_key`` it has.
KeyShape = tuple[str, bool, bool, bool, bool]

_ORDER = "priority DESC, fair_at, id"


def _used(key: str, finishing: bool) -> str:
    """The Running jobs counted under the counter ``key`` (an SQL text expression), less
    those the same statement finishes."""
    used = f"COALESCE((SELECT running FROM {COUNTER} WHERE key = {key}), 0)"
    if finishing:
        used += f" - COALESCE((SELECT n FROM freed WHERE freed.key = {key}), 0)"
    return f"({used})"


def _key_row(n: int, shape: KeyShape, finishing: bool) -> str:
    """The ``keys`` row of key ``n`` (see :func:`limited_claim`)."""
    kind, max_running, per_scope, rate, per_key = shape
    name = f"%(lim_{n})s"
    key = f"%(lim_{n}_key)s::text"
    rooms = []
    if max_running:
        rooms.append(f"%(lim_{n}_max)s::bigint - {_used(key, finishing)}")
    if rate:
        rooms.append(
            f"%(lim_{n}_rate)s::bigint - (SELECT count(*) FROM {CLAIM_START}"
            f" WHERE key = {key} AND started_at > %(lim_{n}_since)s)"
        )
    room = f"LEAST({', '.join(rooms)})" if rooms else "NULL::bigint"
    scope = f"%(lim_{n}_scope)s::bigint" if per_scope else "NULL::bigint"
    keyed = f"%(lim_{n}_pkey)s::bigint" if per_key else "NULL::bigint"
    cap = f"%(lim_{n}_max)s::bigint" if max_running else "NULL::bigint"
    rated = "TRUE" if rate else "FALSE"
    return f"('{kind}'::text, {name}::text, {room}, {scope}, {key}, {rated}, {cap}, {keyed})"


def _counter_deltas(finishing: bool) -> str:
    """Each counter's change by a claim: its claimed jobs' counts less, with
    ``finishing``, the ``freed`` ones; with its cap, from ``keys`` (``max_running``'s
    for a name's counter, ``max_running_per_scope``'s for a pair's: a scope hash is 64
    characters)."""
    changes = f"SELECT key, 1 AS n FROM ({counted_keys('claimed')}) AS c"
    if finishing:
        changes += " UNION ALL SELECT key, -n FROM freed"
    # A per-key counter is the name's key, '#' and the limit key: names have no '#'.
    cap = (
        "COALESCE((SELECT k.cap FROM keys AS k WHERE k.key = u.key),"
        " (SELECT k.scope FROM keys AS k WHERE k.key || ':' || right(u.key, 64) = u.key),"
        " (SELECT k.keyed FROM keys AS k WHERE strpos(u.key, '#') > 0"
        " AND k.key = split_part(u.key, '#', 1)))"
    )
    return f"SELECT u.key, sum(u.n) AS n, {cap} AS cap FROM ({changes}) AS u GROUP BY u.key"


@functools.lru_cache(maxsize=64)
def counted_claim(
    *, queues: int, one_job: bool, finishing: bool, keys: tuple[KeyShape, ...]
) -> str:
    """PostgreSQL: a claim under ``max_running`` and ``max_running_per_scope`` limits
    (no ``rate``) as the plain claim of :func:`jobs.store.sql.claim` makes it — the
    first due jobs, no lock, no usage read — with each job's ``limit_keys`` recorded
    and each counter changed once (the claimed less, with ``finishing``, the freed),
    its cap set to its limit. Should a counter go past its cap, the statement fails
    on :data:`jobs.store.sql.COUNTER_CAP` and changes nothing: a limit binds, and the
    claim is made again under locks (:func:`limited_claim`).

    Parameters as for :func:`limited_claim` (no ``lim_n_since``, ``lim_n_rate``).
    Returns the rows of :func:`jobs.store.sql.claim`."""
    if any(shape[3] for shape in keys):
        raise ValueError("a rate needs the starts in its window: limited_claim")
    rows = ", ".join(
        f"(%(lim_{n}_key)s::text, "
        + (f"%(lim_{n}_max)s::bigint" if max_running else "NULL::bigint")
        + ", "
        + (f"%(lim_{n}_scope)s::bigint" if per_scope else "NULL::bigint")
        + ", "
        + (f"%(lim_{n}_pkey)s::bigint" if per_key else "NULL::bigint")
        + ")"
        for n, (_kind, max_running, per_scope, _rate, per_key) in enumerate(keys)
    )
    ctes = [f"keys AS (SELECT * FROM (VALUES {rows}) AS k(key, cap, scope, keyed))"]
    if finishing:
        ctes[:0] = [
            finish_ctes(),
            f"freed AS (SELECT key, count(*) AS n FROM ({counted_keys('finished')}) AS f"
            " GROUP BY key)",
        ]
    orphans = "NOT EXISTS (SELECT 1 FROM orphans) AND " if finishing else ""
    which = first_due("postgresql", claim_filters(queues=queues, one_job=one_job))
    update = claim_update("postgresql", f"{orphans}{which}", counted=_counted(keys))
    ctes.append(claimed_ctes(update))
    ctes.append(f"counted AS ({counter_changes(_counter_deltas(finishing))})")
    return f"WITH {', '.join(ctes)} " + union_by_kind(claimed_kinds(finishing=finishing))


def _counted(keys: tuple[KeyShape, ...]) -> str:
    """The ``limit_keys`` of a job claimed under ``keys``: a JSON array of the counters
    it counts in — per limited name, ``max_running``'s, with the job's scope
    ``max_running_per_scope``'s and, with its limit key, ``max_running_per_key``'s —,
    or NULL if none."""
    parts = []
    for n, (kind, max_running, per_scope, _rate, per_key) in enumerate(keys):
        column = "handler" if kind == "h" else "queue"
        match = f"WHEN {column} = %(lim_{n})s::text THEN %(lim_{n}_key)s::text"
        if max_running:
            parts.append(f"CASE {match} END")
        if per_scope:
            parts.append(f"CASE {match} || ':' || scope_hash END")
        if per_key:
            keyed = f"WHEN {column} = %(lim_{n})s::text AND limit_key <> ''"
            parts.append(f"CASE {keyed} THEN %(lim_{n}_key)s::text || '#' || limit_key END")
    if not parts:
        return "NULL"
    return f"NULLIF(array_to_json(array_remove(ARRAY[{', '.join(parts)}], NULL))::text, '[]')"


def _scope_used(kind: str, column: str, row: str, finishing: bool) -> str:
    """The Running jobs of the pair (``row``'s name, ``row``'s scope) counted under the
    per-scope counter of key ``k_{kind}``."""
    return _used(f"k_{kind}.key || ':' || {row}.scope_hash", finishing)


def _key_used(kind: str, row: str, finishing: bool) -> str:
    """The Running jobs of the pair (``row``'s name, ``row``'s limit key) counted under
    the per-key counter of key ``k_{kind}``."""
    return _used(f"k_{kind}.key || '#' || {row}.limit_key", finishing)


@functools.lru_cache(maxsize=64)
def limited_claim(
    *, queues: int, one_job: bool, finishing: bool, keys: tuple[KeyShape, ...]
) -> str:
    """PostgreSQL: a claim under limits as one statement — usage, choice, claim and
    counting — to run after the advisory locks of its keys (:data:`LOCK_KEYS`), so
    that its snapshot, taken when it starts, sees every claim the locks' previous
    holders committed.

    The parameters of :func:`jobs.store.sql.claim` (with ``finishing``, the batch's
    too), and per limited key ``n`` of ``keys`` (see :data:`KeyShape`): its name
    ``lim_n``, its counter and rate key ``lim_n_key``, and as it has them
    ``lim_n_max``, ``lim_n_scope``, ``lim_n_rate`` with ``lim_n_since`` (its window's
    start).

    Usage is read from the limit counters (``jobs_limitcounter``), by key: no job is
    counted. In the statement: ``freed`` — with ``finishing``, the counts the jobs it
    finishes give back; ``keys`` — per key, its ``room`` (the starts ``max_running``
    and ``rate`` still allow, the fewer) and its per-scope limit; ``candidates`` — up
    to ``limit`` due jobs in claim order, locked (``SKIP LOCKED``), leaving out the
    handlers and queues without room and the (name, scope) pairs at their per-scope
    limit; ``chosen`` — all of them when every key has room for ``limit`` more starts
    (``ample``: the limits cannot bind), else those whose rank among the candidates
    of each of their keys is within its room (``ranked``; a job is refused when as
    many candidates of one of its keys come before it as that key has room: a claim
    never takes more than any room, and may take fewer where one key's refusal
    leaves another's room unused); then the claim's update of the chosen jobs
    (locked, so their guard still holds; each records its ``limit_keys``) and attempt
    rows, one change per counter (``counted``: the claimed jobs' counts less the
    freed ones), and a ``jobs_claimstart`` row per start of a rate-limited key.

    Returns the rows of :func:`jobs.store.sql.claim` with ``finishing`` (a ``kind``
    per row), and a row of kind ``'skipped'`` when a limit refused a candidate: a
    claim of the rest may find jobs past it."""
    names = {kind: [n for n, k in enumerate(keys) if k[0] == kind] for kind in ("h", "q")}
    ctes = [
        "keys AS (SELECT * FROM (VALUES "
        + ", ".join(_key_row(n, shape, finishing) for n, shape in enumerate(keys))
        + ") AS k(kind, name, room, scope, key, rated, cap, keyed))",
    ]
    if finishing:
        ctes.insert(
            0,
            f"freed AS (SELECT key, count(*) AS n FROM ({counted_keys('finished')}) AS f"
            " GROUP BY key)",
        )
    guard = " AND ".join(claim_filters(queues=queues, one_job=one_job))
    kinds = [(kind, column) for kind, column in (("h", "handler"), ("q", "queue")) if names[kind]]
    picks = []
    ranks = []
    admits = []
    joins = []
    scope_ample = []
    for kind, column in kinds:
        shapes = [keys[n] for n in names[kind]]
        if any(s[1] or s[3] for s in shapes):
            picks.append(
                f"{column} NOT IN (SELECT name FROM keys WHERE kind = '{kind}' AND room <= 0)"
            )
            ranks.append(f"row_number() OVER (PARTITION BY {column} ORDER BY {_ORDER}) AS n_{kind}")
            admits.append(f"(k_{kind}.room IS NULL OR r.n_{kind} <= k_{kind}.room)")
        if any(s[2] for s in shapes):
            picks.append(
                f"NOT EXISTS (SELECT 1 FROM keys AS k_{kind} WHERE k_{kind}.kind = '{kind}'"
                f" AND k_{kind}.name = {JOB}.{column} AND k_{kind}.scope IS NOT NULL"
                f" AND {_scope_used(kind, column, JOB, finishing)} >= k_{kind}.scope)"
            )
            ranks.append(
                f"row_number() OVER (PARTITION BY {column}, scope_hash ORDER BY {_ORDER})"
                f" AS n_{kind}s"
            )
            admits.append(
                f"(k_{kind}.scope IS NULL"
                f" OR r.n_{kind}s + {_scope_used(kind, column, 'r', finishing)} <= k_{kind}.scope)"
            )
            # Room for the whole claim in the busiest pair among the candidates.
            scope_ample.append(
                f"NOT EXISTS (SELECT 1 FROM candidates AS r JOIN keys AS k_{kind}"
                f" ON k_{kind}.kind = '{kind}' AND k_{kind}.name = r.{column}"
                f" WHERE k_{kind}.scope IS NOT NULL"
                f" AND k_{kind}.scope < %(limit)s + {_scope_used(kind, column, 'r', finishing)})"
            )
        if any(s[4] for s in shapes):
            # The same per limit key, for the jobs that have one.
            picks.append(
                f"NOT EXISTS (SELECT 1 FROM keys AS k_{kind} WHERE k_{kind}.kind = '{kind}'"
                f" AND k_{kind}.name = {JOB}.{column} AND k_{kind}.keyed IS NOT NULL"
                f" AND {JOB}.limit_key <> ''"
                f" AND {_key_used(kind, JOB, finishing)} >= k_{kind}.keyed)"
            )
            ranks.append(
                f"row_number() OVER (PARTITION BY {column}, limit_key ORDER BY {_ORDER})"
                f" AS n_{kind}k"
            )
            admits.append(
                f"(k_{kind}.keyed IS NULL OR r.limit_key = ''"
                f" OR r.n_{kind}k + {_key_used(kind, 'r', finishing)} <= k_{kind}.keyed)"
            )
            scope_ample.append(
                f"NOT EXISTS (SELECT 1 FROM candidates AS r JOIN keys AS k_{kind}"
                f" ON k_{kind}.kind = '{kind}' AND k_{kind}.name = r.{column}"
                f" WHERE k_{kind}.keyed IS NOT NULL AND r.limit_key <> ''"
                f" AND k_{kind}.keyed < %(limit)s + {_key_used(kind, 'r', finishing)})"
            )
        joins.append(
            f" LEFT JOIN keys AS k_{kind}"
            f" ON k_{kind}.kind = '{kind}' AND k_{kind}.name = r.{column}"
        )
    ctes.append(
        "candidates AS (SELECT id, handler, queue, scope_hash, limit_key, priority, fair_at"
        f" FROM {JOB}"
        f" WHERE {' AND '.join([guard, *picks])}"
        f" ORDER BY {_ORDER} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
    )
    ctes.append(
        f"ranked AS (SELECT id, handler, queue, scope_hash, limit_key, {', '.join(ranks)}"
        " FROM candidates)"
    )
    # Room for the whole claim under every limit: the candidates as they come (the
    # ranking is then never computed).
    ample = ["(SELECT bool_and(room IS NULL OR room >= %(limit)s) FROM keys)", *scope_ample]
    ctes.append(f"ample AS (SELECT {' AND '.join(ample)} AS yes)")
    ctes.append(
        "chosen AS (SELECT id FROM candidates WHERE (SELECT yes FROM ample)"
        " UNION ALL SELECT r.id FROM ranked AS r"
        + "".join(joins)
        + f" WHERE NOT (SELECT yes FROM ample) AND {' AND '.join(admits)})"
    )
    orphans = "NOT EXISTS (SELECT 1 FROM orphans) AND " if finishing else ""
    # The candidates are locked by this statement: their guard holds still.
    update = claim_update(
        "postgresql",
        f"{orphans}id = ANY(ARRAY(SELECT id FROM chosen)) AND status = '{QUEUED}'",
        counted=_counted(keys),
    )
    ctes.append(claimed_ctes(update))
    ctes.append(f"counted AS ({counter_changes(_counter_deltas(finishing))})")
    if any(shape[3] for shape in keys):
        ctes.append(
            f"starts AS (INSERT INTO {CLAIM_START} (key, started_at)"
            " SELECT k.key, %(now)s FROM claimed AS c JOIN keys AS k ON k.rated"
            " AND ((k.kind = 'h' AND k.name = c.handler) OR (k.kind = 'q' AND k.name = c.queue)))"
        )
    if finishing:
        ctes.insert(0, finish_ctes())
    skipped = (
        "(SELECT 1 WHERE (SELECT count(*) FROM candidates) > (SELECT count(*) FROM chosen)) AS s"
    )
    return f"WITH {', '.join(ctes)} " + union_by_kind(
        [*claimed_kinds(finishing=finishing), ("skipped", skipped, {})]
    )


#: The end of a claim's transaction, sent in its round trip (see
#: :func:`jobs.store.limits.claim_locked`).
COMMIT = "COMMIT"


@functools.lru_cache(maxsize=64)
def usage(handlers: int, queues: int, rate_keys: int) -> str:
    """SQLite: what limits count, in one statement: rows of ``kind`` ``'running'`` —
    the Running jobs of ``handlers`` limited handler names (``lim_handler_0``…) or
    ``queues`` limited queues (``lim_queue_0``…), per ``handler``, ``queue``,
    ``scope_hash`` and ``limit_key``, in ``n`` — and rows of ``kind`` ``'started'`` — per rate key
    (``key_0``…), in ``n``, the starts after its window's start (``since_0``…). Only
    Running jobs hold a current token: the small partial index of tokens serves the
    first part, the (key, started_at) index each term of the second."""
    either = []
    if handlers:
        either.append(f"handler IN ({in_list('lim_handler', handlers)})")
    if queues:
        either.append(f"queue IN ({in_list('lim_queue', queues)})")
    running = (
        "SELECT 'running' AS kind, handler, queue, scope_hash, limit_key, NULL AS key,"
        f" count(*) AS n FROM {JOB} WHERE current_token IS NOT NULL AND status = '{RUNNING}'"
        f" AND ({' OR '.join(either)}) GROUP BY handler, queue, scope_hash, limit_key"
    )
    if not rate_keys:
        return running
    terms = " OR ".join(
        f"(key = %(key_{n})s AND started_at > %(since_{n})s)" for n in range(rate_keys)
    )
    return (
        f"{running} UNION ALL SELECT 'started', NULL, NULL, NULL, NULL, key, count(*)"
        f" FROM {CLAIM_START} WHERE {terms} GROUP BY key"
    )


@functools.lru_cache(maxsize=256)
def candidates(
    *,
    queues: int,
    one_job: bool,
    full_handlers: int,
    full_queues: int,
    full_handler_scopes: int,
    full_queue_scopes: int,
    full_handler_keys: int = 0,
    full_queue_keys: int = 0,
    seen: int = 0,
) -> str:
    """Due jobs a claim under limits may take, in claim order, up to ``limit``: the
    guard of every claim, minus the handlers (``fh_0``…) and queues (``fq_0``…) at a
    limit, the (handler, scope) and (queue, scope) pairs at a per-scope limit
    (``fhs_k_0``/``fhs_s_0``…, ``fqs_k_0``/``fqs_s_0``…), the (name, limit key) pairs
    at a per-key limit (``fhk_…``, ``fqk_…``), and the ``seen`` jobs an earlier page
    returned (``seen_0``…). Returns each job's ``id``, ``handler``, ``queue``,
    ``scope_hash`` and ``limit_key``. SQLite (whose claims hold the write
    lock)."""
    filters = list(CLAIMABLE)
    if queues:
        filters.append(f"queue IN ({in_list('queue', queues)})")
    if one_job:
        filters.append("scope_hash = %(scope_hash)s AND job_id = %(job_id)s")
    if full_handlers:
        filters.append(f"handler NOT IN ({in_list('fh', full_handlers)})")
    if full_queues:
        filters.append(f"queue NOT IN ({in_list('fq', full_queues)})")
    for column, prefix, count, keyed in (
        ("handler", "fhs", full_handler_scopes, "scope_hash"),
        ("queue", "fqs", full_queue_scopes, "scope_hash"),
        ("handler", "fhk", full_handler_keys, "limit_key"),
        ("queue", "fqk", full_queue_keys, "limit_key"),
    ):
        if count:
            pairs = " OR ".join(
                f"({column} = %({prefix}_k_{n})s AND {keyed} = %({prefix}_s_{n})s)"
                for n in range(count)
            )
            filters.append(f"NOT ({pairs})")
    if seen:
        filters.append(f"id NOT IN ({in_list('seen', seen)})")
    return (
        f"SELECT id, handler, queue, scope_hash, limit_key FROM {JOB}"
        f" WHERE {' AND '.join(filters)} ORDER BY {_ORDER} LIMIT %(limit)s"
    )


@functools.lru_cache(maxsize=64)
def insert_claim_starts(rows: int) -> str:
    """One row per rate-limited start (``key_0``…), all at ``now``."""
    return f"INSERT INTO {CLAIM_START} (key, started_at) VALUES " + values_of(
        ["key"], rows, ", %(now)s"
    )


#: Starts older than ``before`` (every window ended before it, with a margin).
PRUNE_CLAIM_STARTS = f"DELETE FROM {CLAIM_START} WHERE started_at < %(before)s"


# --------------------------------------------------------------------------- pause


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


# --------------------------------------------------------------------------- snooze


#: A job Queued again counts in no limit counter (a claim without limits leaves
#: ``limit_keys`` as it is); the statement returns the counters it counted in before,
#: read in the statement's snapshot, to give their counts back.
_COUNTED_BEFORE = f"(SELECT was.limit_keys FROM {JOB} AS was WHERE was.id = {JOB}.id) AS limit_keys"


#: Snooze: queue the job Running under ``token`` again at ``run_at`` (``now``; its place
#: in line ``run_at_place``, as a job submitted for then), unless
#: a cancel request committed first or the job snoozed ``max_snoozes`` times already;
#: the execution is taken back from ``attempt_count`` and counted in ``snooze_count``
#: instead. Returns the job's ``id``, ``queue`` and ``limit_keys``.
SNOOZE_JOB = (
    f"UPDATE {JOB} SET status = '{QUEUED}', next_run_at = %(run_at)s,"
    " fair_at = %(run_at_place)s,"
    " attempt_count = attempt_count - 1, snooze_count = snooze_count + 1,"
    f" {LEAVE_RUNNING}, started_at = NULL,"
    " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
    " finished_at = NULL, handler_unknown_since = NULL, limit_keys = NULL, updated_at = %(now)s"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}' AND NOT cancel_requested"
    f" AND snooze_count < %(max_snoozes)s RETURNING id, queue, {_COUNTED_BEFORE}"
)

#: Why a snooze of the job Running under ``token`` did not happen: its cancel
#: flag and snooze count, with its handler (no row: the token is stale).
SNOOZE_REFUSED = (
    f"SELECT cancel_requested, snooze_count, handler FROM {JOB}"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}'"
)


def _end_attempt(status: str, text: str) -> str:
    """The Running attempt row under ``token`` of the job ``job`` (a snoozed, released
    or recovered job, changed by the same transaction) ends ``status`` at ``now``, with
    the parameter ``text`` as its error. Returns its ``id``."""
    return (
        f"UPDATE {ATTEMPT} SET status = '{status}', finished_at = %(now)s, error = %({text})s"
        f" WHERE job_id = %(job)s AND token = %(token)s AND status = '{RUNNING}' RETURNING id"
    )


#: Snooze: the snoozed job's (``job``) Running attempt row under ``token`` ends Snoozed
#: with ``note``. Returns its ``id``.
SNOOZE_ATTEMPT = _end_attempt(SNOOZED, "note")


# --------------------------------------------------------------------------- release

RELEASED = "released"

#: Release: the job Running under ``token``, without a cancel request, Queued again as
#: it was before the claim (its ``next_run_at`` kept: it was due), the claim taken back
#: from ``attempt_count`` and counted in ``release_count``; like every re-queue but a
#: put-back it starts a new unknown-handler window. Returns the job's ``id``,
#: ``queue`` and the ``limit_keys`` it counted in, to give their counts back.
RELEASE_JOB = (
    f"UPDATE {JOB} SET status = '{QUEUED}',"
    " attempt_count = attempt_count - 1, release_count = release_count + 1,"
    f" {LEAVE_RUNNING}, started_at = NULL,"
    " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
    " finished_at = NULL, handler_unknown_since = NULL, limit_keys = NULL, updated_at = %(now)s"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}' AND NOT cancel_requested"
    f" RETURNING id, queue, {_COUNTED_BEFORE}"
)

#: Release: the released job's (``job``) Running attempt row under ``token`` ends
#: Released with ``reason``. Returns its ``id``.
RELEASE_ATTEMPT = _end_attempt(RELEASED, "reason")


# --------------------------------------------------------------------------- recovery
#
# The crash budget. An attempt recovered because its worker died or outlived its
# shutdown's grace is counted in the job's ``interruption_count`` instead of its
# ``attempt_count``. While the count, this interruption included, stays below
# ``max_interruptions`` the job is Queued again at once; the interruption that reaches
# it ends the job Interrupted as one that keeps killing its worker. A cancel request
# that committed first ends the job Cancelled, as a finish would (the attempt counted).

#: The recovered job is Queued again.
_BACK = "NOT cancel_requested AND interruption_count + 1 < %(max_interruptions)s"
#: The recovery reaches the budget: the job keeps killing its worker.
_SPENT = "NOT cancel_requested AND interruption_count + 1 >= %(max_interruptions)s"


@functools.lru_cache(maxsize=4)
def recover_job(*, lease_guard: bool = False, owner_guard: bool = False) -> str:
    """Recovery with re-queue of the job Running under ``token``, as the crash budget
    says (parameters ``max_interruptions``, ``now``; its error ``summary``, or with the
    budget reached ``spent``). With ``lease_guard`` only
    if its lease expired before ``lease_expired_before``; with ``owner_guard`` only
    if ``leased_by`` holds it (recovery never robs a live worker). Queued again, it is
    due at once and starts a new unknown-handler window; like every way out of Running
    it drops its limit counters. Returns the job's ``id``, new ``status``,
    ``scope_hash``, ``job_id``, ``handler``, ``queue``, ``interruption_count`` and the
    ``limit_keys`` it counted in, to give their counts back."""
    guard = f"current_token = %(token)s AND status = '{RUNNING}'"
    if lease_guard:
        guard += " AND lease_expires_at < %(lease_expired_before)s"
    if owner_guard:
        guard += " AND leased_by = %(leased_by)s"
    kept = "CASE WHEN cancel_requested THEN {0} ELSE {0} {1} END"
    return (
        f"UPDATE {JOB} SET"
        f" status = CASE WHEN cancel_requested THEN '{CANCELLED}' WHEN {_BACK} THEN '{QUEUED}'"
        f" ELSE '{INTERRUPTED}' END,"
        f" attempt_count = {kept.format('attempt_count', '- 1')},"
        f" interruption_count = {kept.format('interruption_count', '+ 1')},"
        f" keeps_killing_worker = {_SPENT},"
        f" next_run_at = CASE WHEN {_BACK} THEN %(now)s ELSE next_run_at END,"
        f" started_at = CASE WHEN {_BACK} THEN NULL ELSE started_at END,"
        f" finished_at = CASE WHEN {_BACK} THEN NULL ELSE %(now)s END,"
        f" progress = CASE WHEN {_BACK} THEN NULL ELSE progress END,"
        f" progress_message = CASE WHEN {_BACK} THEN '' ELSE progress_message END,"
        f" handler_unknown_since = CASE WHEN {_BACK} THEN NULL ELSE handler_unknown_since END,"
        f" error = CASE WHEN {_SPENT} THEN %(spent)s ELSE %(summary)s END,"
        f" result_ref = NULL, limit_keys = NULL, {LEAVE_RUNNING}, updated_at = %(now)s"
        f" WHERE {guard}"
        " RETURNING id, status, scope_hash, job_id, handler, queue, interruption_count,"
        f" batch_id, sequence_key, {_COUNTED_BEFORE}"
    )


#: Recovery: the recovered job's (``job``) Running attempt row under ``token`` ends
#: Interrupted with ``reason``, whatever its job became. Returns its ``id``.
RECOVER_ATTEMPT = _end_attempt(INTERRUPTED, "reason")


# --------------------------------------------------------------------------- put back


#: A worker without the job's handler: undo the claim under ``token`` (job Running) —
#: the attempt count goes back down — and decide: a cancel request that committed first
#: ends the job Cancelled; once the job's first such claim (``handler_unknown_since``,
#: set by the first) is at or before ``window_start`` it ends Failed with ``failed``;
#: else it is Queued again at ``run_at`` (its place ``run_at_place``), with ``waiting`` as
#: its error. Returns the job's new ``status``.
_OVER = "COALESCE(handler_unknown_since, %(now)s) <= %(window_start)s"
PUT_BACK_UNKNOWN_HANDLER = (
    f"UPDATE {JOB} SET"
    f" status = CASE WHEN cancel_requested THEN '{CANCELLED}'"
    f" WHEN {_OVER} THEN '{JobStatus.FAILED.value}' ELSE '{QUEUED}' END,"
    f" finished_at = CASE WHEN cancel_requested OR {_OVER} THEN %(now)s ELSE NULL END,"
    f" next_run_at = CASE WHEN cancel_requested OR {_OVER} THEN next_run_at ELSE %(run_at)s END,"
    f" fair_at = CASE WHEN cancel_requested OR {_OVER} THEN fair_at ELSE %(run_at_place)s END,"
    f" error = CASE WHEN cancel_requested THEN '' WHEN {_OVER} THEN %(failed)s"
    " ELSE %(waiting)s END,"
    " handler_unknown_since = COALESCE(handler_unknown_since, %(now)s),"
    " attempt_count = attempt_count - 1, limit_keys = NULL, updated_at = %(now)s,"
    f" {LEAVE_RUNNING},"
    " started_at = NULL, progress = NULL, progress_message = '', result_ref = NULL"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}'"
    f" RETURNING {', '.join(ENDING_COLUMNS)}, {_COUNTED_BEFORE}"
)


# --------------------------------------------------------------------------- expiry

EXPIRED = JobStatus.EXPIRED.value


@functools.lru_cache(maxsize=4)
def expire_jobs(vendor: str) -> str:
    """End up to ``limit`` Queued jobs whose start deadline is at or before ``now``
    Expired, the earliest deadlines first, with ``error``; no attempt is used. On
    PostgreSQL, jobs another transaction holds (a claim, a cancel) are skipped: the
    next sweep finds them if they are still Queued. Returns each expired job's
    :data:`jobs.store.sql_endings.ENDING_COLUMNS` (what its batch and sequence need)."""
    due = f"status = '{QUEUED}' AND start_by IS NOT NULL AND start_by <= %(now)s"
    which = id_among_locked(
        vendor, f"SELECT id FROM {JOB} WHERE {due} ORDER BY start_by LIMIT %(limit)s"
    )
    return (
        f"UPDATE {JOB} SET status = '{EXPIRED}', finished_at = %(now)s, updated_at = %(now)s,"
        f" error = %(error)s WHERE {which} AND {due} RETURNING {', '.join(ENDING_COLUMNS)}"
    )
