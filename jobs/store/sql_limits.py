"""The raw SQL of claims under limits, as named builders in the manner of
:mod:`jobs.store.sql`: named parameters, named result columns, cached texts.

PostgreSQL claims under limits first with :func:`counted_claim` — the plain claim's
choice, with each touched limit counter and rate row changed in the same statement,
whose constraints refuse it whole should it go past a limit — and, when a limit binds,
with :data:`LOCK_KEYS` then :func:`limited_claim`, which leaves out the jobs whose
limits have no room. SQLite claims under its write lock: :func:`usage`,
:func:`candidates` and :func:`read_rates` before the plain claim by id, and
:func:`write_rates` after it.

A rate's row (``jobs_ratebucket``, one per rate key) is changed from its latest
version by the statement's upsert, never from a value read earlier: whatever another
claim committed meanwhile, its constraint sees the sum.

- A token bucket (a rate with a burst), kept as GCRA: ``c`` units at ``now`` (in
  nanoseconds; T the interval between two units) set ``tat = max(tat, now) + c·T`` and
  ``horizon = now + burst·T``; ``tat <= horizon``.
- A sliding window (no burst): ``stamps`` keeps ``[time, units]`` of the starts in the
  window, each time rounded up to the rate's grain (see
  :meth:`jobs.flow_control.Rate.quantum_ns`); ``c`` units at ``now`` add ``c`` at
  ``now``; ``used``, the units after ``window_start = now - seconds``, ``<= cap`` (the
  count). Times are dropped an eighth of the window later (``horizon``), so that a
  claimer whose clock is behind by less than that still counts every start it should.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from ..db import in_list, union_by_kind, values_of
from ..models import RateBucket
from .sql import (
    COUNTER,
    JOB,
    QUEUED,
    RUNNING,
    claim_update,
    claimed_ctes,
    claimed_kinds,
    counted_keys,
    counter_changes,
    finish_ctes,
    first_due,
    in_line,
)

RATE = RateBucket._meta.db_table

#: The constraints a rate's row fails on when a claim would go past it.
RATE_BURST = "jobs_ratebucket_within_burst"
RATE_WINDOW = "jobs_ratebucket_within_window"

#: PostgreSQL: take the transaction-scoped advisory lock of every ``keys`` (a bigint
#: array, sorted: every claimer takes them in the same order, so none deadlocks).
#: ``unnest`` yields them in array order; each lock waits for the transaction holding
#: it to end.
LOCK_KEYS = "SELECT count(pg_advisory_xact_lock(k)) AS locked FROM unnest(%(keys)s::bigint[]) AS k"

#: The end of a claim's transaction, sent in its round trip (see
#: :func:`jobs.store.limits.claim_locked`).
COMMIT = "COMMIT"

_ORDER = "priority DESC, fair_at, id"
_NOW = "%(now_ns)s::bigint"
_NULL = "NULL::bigint"
_KINDS = (("h", "handler"), ("q", "queue"))


class KeyShape(NamedTuple):
    """One limited name of a claim under limits: its kind (``"h"``, a handler name,
    or ``"q"``, a queue), which counted limits it has, and its rates, each ``""``
    (none), ``"window"`` or ``"bucket"`` (with a burst)."""

    kind: str
    max_running: bool = False
    per_scope: bool = False
    per_key: bool = False
    rate: str = ""
    rate_per_key: str = ""

    @property
    def counted(self) -> bool:
        return self.max_running or self.per_scope or self.per_key


def _rate_values(n: int, prefix: str, shape: str) -> tuple[str, str, str, str]:
    """A rate's ``count``, ``burst``, ``t`` and ``span`` as SQL: parameters
    ``lim_{n}_{prefix}_…`` for what its kind has, NULL for the rest."""
    param = f"%(lim_{n}_{prefix}_{{}})s::bigint".format
    if shape == "bucket":
        return _NULL, param("burst"), param("t"), _NULL
    if shape == "window":
        return param("count"), _NULL, _NULL, param("span")
    return _NULL, _NULL, _NULL, _NULL


def _rates_cte(keys: tuple[KeyShape, ...]) -> str:
    """``rates``: one row per declared rate — ``kind``, ``name``, ``key`` (the name's
    rate key; a per-key rate's keys are it, ``#`` and the limit key), ``keyed``
    (per limit key), ``count``, ``burst``, ``t``, ``span`` and ``grain`` (parameters
    ``lim_n_r_…`` for a name's rate, ``lim_n_rk_…`` for its per-key rate)."""
    rows = []
    for n, shape in enumerate(keys):
        for prefix, kind, keyed in (("r", shape.rate, "FALSE"), ("rk", shape.rate_per_key, "TRUE")):
            if not kind:
                continue
            grain = f"%(lim_{n}_{prefix}_grain)s::bigint" if kind == "window" else _NULL
            values = ", ".join(_rate_values(n, prefix, kind))
            rows.append(
                f"('{shape.kind}'::text, %(lim_{n})s::text, %(lim_{n}_key)s::text, {keyed},"
                f" {values}, {grain})"
            )
    return (
        f"rates AS (SELECT * FROM (VALUES {', '.join(rows)})"
        " AS r(kind, name, key, keyed, count, burst, t, span, grain))"
    )


#: The units a job ``j`` counts under a rate of capacity ``cap``: its cost, at most
#: the capacity (a cost above it was refused at submit; a job submitted before the
#: rate was declared counts as a full burst).
def _units(job: str, cap: str) -> str:
    return f"LEAST({job}.cost, {cap})"


def _in_window(stamps: str, since: str) -> str:
    """The units of ``stamps`` (a jsonb array of ``[time, units]``) started after
    ``since``."""
    return (
        f"(SELECT COALESCE(sum((e->>1)::bigint), 0) FROM jsonb_array_elements({stamps}) AS e"
        f" WHERE (e->>0)::bigint > {since})"
    )


def _room(key: str, count: str, burst: str, t: str, span: str) -> str:
    """The units the rate (``count``, ``burst``, ``t``, ``span``: SQL expressions,
    a bucket's ``t`` not NULL) of rate key ``key`` lets start now: a bucket's
    ``burst`` less what its ``tat`` is ahead of now, in units; a window's count less
    the units in it. A key without a row has its whole capacity."""
    bucket = f"({_NOW} + {burst} * {t} - GREATEST(b.tat, {_NOW})) / {t}"
    window = (
        f"{count} - {_in_window('COALESCE(b.stamps, jsonb_build_array())', f'{_NOW} - {span}')}"
    )
    return (
        f"COALESCE((SELECT CASE WHEN {t} IS NOT NULL THEN {bucket} ELSE {window} END"
        f" FROM {RATE} AS b WHERE b.key = {key}), {burst}, {count})"
    )


def _buckets_cte() -> str:
    """``buckets``: the change of every rate row the ``claimed`` jobs count in (see
    the module's docstring), in key order — the rows' locks are taken in one order by
    every claim. A row's constraint fails the statement that would take it past its
    rate."""
    matches = (
        "((r.kind = 'h' AND r.name = c.handler) OR (r.kind = 'q' AND r.name = c.queue))"
        " AND (NOT r.keyed OR c.limit_key <> '')"
    )
    taken = (
        "SELECT CASE WHEN r.keyed THEN r.key || '#' || c.limit_key ELSE r.key END AS key,"
        f" sum({_units('c', 'COALESCE(r.burst, r.count)')}) AS units, min(r.count) AS count,"
        " min(r.burst) AS burst, min(r.t) AS t, min(r.span) AS span, min(r.grain) AS grain"
        f" FROM claimed AS c JOIN rates AS r ON {matches} GROUP BY 1"
    )
    # A window's start time, rounded up to its grain.
    stamp = f"(({_NOW} + n.grain - 1) / n.grain) * n.grain"
    rows = (
        f"SELECT n.key, {_NOW} + n.units * n.t,"
        f" COALESCE({_NOW} + n.burst * n.t, {_NOW} - n.span - n.span / 8),"
        f" CASE WHEN n.t IS NULL THEN jsonb_build_array(jsonb_build_array({stamp}, n.units)) END,"
        " CASE WHEN n.t IS NULL THEN n.units END, n.count,"
        f" CASE WHEN n.t IS NULL THEN {_NOW} - n.span END,"
        f" COALESCE({_NOW} + n.units * n.t, {stamp} + n.span)"
        f" FROM ({taken}) AS n ORDER BY n.key"
    )
    merged = "COALESCE(b.stamps, jsonb_build_array()) || excluded.stamps"
    kept = (
        "(SELECT jsonb_agg(jsonb_build_array(s.t, s.n) ORDER BY s.t) FROM"
        " (SELECT (e->>0)::bigint AS t, sum((e->>1)::bigint) AS n"
        f" FROM jsonb_array_elements({merged}) AS e"
        " WHERE (e->>0)::bigint > excluded.horizon GROUP BY 1) AS s)"
    )
    tat = f"GREATEST(b.tat, {_NOW}) + excluded.tat - {_NOW}"
    return (
        f"buckets AS (INSERT INTO {RATE} AS b"
        " (key, tat, horizon, stamps, used, cap, window_start, ends) "
        + rows
        + f" ON CONFLICT (key) DO UPDATE SET tat = {tat}, horizon = excluded.horizon,"
        f" stamps = CASE WHEN excluded.stamps IS NOT NULL THEN {kept} END,"
        # A bucket's row keeps no window: its used is NULL, read nothing for it.
        " used = CASE WHEN excluded.stamps IS NOT NULL THEN excluded.used"
        f" + {_in_window('COALESCE(b.stamps, jsonb_build_array())', 'excluded.window_start')}"
        " END,"
        " cap = excluded.cap, window_start = excluded.window_start,"
        f" ends = CASE WHEN excluded.tat IS NOT NULL THEN {tat}"
        " ELSE GREATEST(b.ends, excluded.ends) END)"
    )


def _used(key: str, finishing: bool) -> str:
    """The Running jobs counted under the counter ``key`` (an SQL text expression), less
    those the same statement finishes."""
    used = f"COALESCE((SELECT running FROM {COUNTER} WHERE key = {key}), 0)"
    if finishing:
        used += f" - COALESCE((SELECT n FROM freed WHERE freed.key = {key}), 0)"
    return f"({used})"


def _counter_parts(keys: tuple[KeyShape, ...], row: str) -> list[tuple[str, str]]:
    """Each counter a job ``row`` (a prefix: ``""`` or ``"c."``) claimed under ``keys``
    may count in, as SQL: its key — NULL if the job does not count in it — and its cap.
    Per limited name: ``max_running``'s, with the job's scope ``max_running_per_scope``'s
    and, with its limit key, ``max_running_per_key``'s."""
    parts = []
    for n, shape in enumerate(keys):
        column = f"{row}{'handler' if shape.kind == 'h' else 'queue'}"
        name, key = f"%(lim_{n})s::text", f"%(lim_{n}_key)s::text"
        match = f"WHEN {column} = {name} THEN {key}"
        if shape.max_running:
            parts.append((f"CASE {match} END", f"%(lim_{n}_max)s::bigint"))
        if shape.per_scope:
            parts.append(
                (f"CASE {match} || ':' || {row}scope_hash END", f"%(lim_{n}_scope)s::bigint")
            )
        if shape.per_key:
            keyed = f"WHEN {column} = {name} AND {row}limit_key <> ''"
            parts.append(
                (
                    f"CASE {keyed} THEN {key} || '#' || {row}limit_key END",
                    f"%(lim_{n}_pkey)s::bigint",
                )
            )
    return parts


def _counter_deltas(keys: tuple[KeyShape, ...], finishing: bool) -> str:
    """Each counter's change by a claim: its claimed jobs' counts less, with
    ``finishing``, the ``freed`` ones; with its cap, the limit of the claimed jobs'
    (a count given back keeps the counter's). The claimed jobs' counters are read from
    their rows, as :func:`_counted` wrote them, not parsed back from ``limit_keys``."""
    parts = _counter_parts(keys, "c.")
    changes = (
        f"SELECT t.key, 1 AS n, t.cap FROM claimed AS c CROSS JOIN LATERAL"
        f" unnest(ARRAY[{', '.join(key for key, _ in parts)}],"
        f" ARRAY[{', '.join(cap for _, cap in parts)}]) AS t(key, cap) WHERE t.key IS NOT NULL"
        if parts
        else f"SELECT NULL::text AS key, 0 AS n, {_NULL} AS cap WHERE FALSE"
    )
    if finishing:
        changes += f" UNION ALL SELECT key, -n, {_NULL} FROM freed"
    return f"SELECT u.key, sum(u.n) AS n, max(u.cap) AS cap FROM ({changes}) AS u GROUP BY u.key"


def _counted(keys: tuple[KeyShape, ...]) -> str:
    """The ``limit_keys`` of a job claimed under ``keys``: a JSON array of the counters
    it counts in (:func:`_counter_parts`), or NULL if none."""
    parts = [key for key, _cap in _counter_parts(keys, "")]
    if not parts:
        return "NULL"
    return f"NULLIF(array_to_json(array_remove(ARRAY[{', '.join(parts)}], NULL))::text, '[]')"


def _changes(keys: tuple[KeyShape, ...], finishing: bool) -> list[str]:
    """The CTEs that change the limits' rows after ``claimed``: ``counted`` (one change
    per counter), and ``rates`` with ``buckets``."""
    ctes = []
    if any(shape.counted for shape in keys) or finishing:
        # Without a counted limit, the finished jobs still give their counts back.
        ctes.append(f"counted AS ({counter_changes(_counter_deltas(keys, finishing))})")
    if any(shape.rate or shape.rate_per_key for shape in keys):
        ctes += [_rates_cte(keys), _buckets_cte()]
    return ctes


def _freed() -> str:
    return (
        f"freed AS (SELECT key, count(*) AS n FROM ({counted_keys('finished')}) AS f GROUP BY key)"
    )


@functools.lru_cache(maxsize=64)
def counted_claim(
    *, queues: int, one_job: bool, finishing: bool, keys: tuple[KeyShape, ...]
) -> str:
    """PostgreSQL: a claim under limits as the plain claim of
    :func:`jobs.store.sql.claim` makes it — the first due jobs, no lock, no usage
    read — with each job's ``limit_keys`` recorded, each counter changed once (the
    claimed less, with ``finishing``, the freed), its cap set to its limit, and each
    rate row the claimed jobs count in changed once (``buckets``). Should a counter
    go past its cap or a rate row past its rate, the statement fails on its constraint
    (:data:`jobs.store.sql.COUNTER_CAP`, :data:`RATE_BURST`, :data:`RATE_WINDOW`) and
    changes nothing: a limit binds, and the claim is made again the exact way
    (:func:`limited_claim`).

    Parameters: those of :func:`jobs.store.sql.claim` (with ``finishing``, the
    batch's too), ``now_ns`` (``now`` in nanoseconds since the epoch), and per
    limited name ``n`` (see :class:`KeyShape`): ``lim_n``, ``lim_n_key`` and as it
    has them ``lim_n_max``, ``lim_n_scope``, ``lim_n_pkey``; per rate, ``lim_n_r_…``
    (its own) or ``lim_n_rk_…`` (per key): a bucket's ``burst`` and ``t`` (the
    interval of a unit), a window's ``count``, ``span`` and ``grain`` (nanoseconds).
    Returns the rows of :func:`jobs.store.sql.claim`."""
    ctes = []
    if finishing:
        ctes += [finish_ctes(), _freed()]
    orphans = "NOT EXISTS (SELECT 1 FROM orphans) AND " if finishing else ""
    which = first_due("postgresql", queues=queues, one_job=one_job)
    update = claim_update("postgresql", f"{orphans}{which}", counted=_counted(keys))
    ctes.append(claimed_ctes(update))
    ctes += _changes(keys, finishing)
    return f"WITH {', '.join(ctes)} " + union_by_kind(claimed_kinds(finishing=finishing))


# --------------------------------------------------------------------------- the exact claim


class _Rule(NamedTuple):
    """A limit of one kind of name, as the exact claim checks it: ``label`` (the
    ``held`` rows' rule, ``handler.rate`` and so on), what leaves a job out of the
    candidates (``excludes``, of a row alias), and what admits a ranked one
    (``admits``, of ``r`` and its name's ``keys`` row ``k_<kind>``)."""

    label: str
    excludes: str
    admits: str


def _key_room(kind: str, row: str) -> str:
    """The room of the per-key rate of ``row``'s limit key under the ``keys`` row
    ``k_{kind}``."""
    k = f"k_{kind}"
    return _room(
        f"{k}.key || '#' || {row}.limit_key",
        f"{k}.rk_count",
        f"{k}.rk_burst",
        f"{k}.rk_t",
        f"{k}.rk_span",
    )


def _rules(kind: str, column: str, shapes: list[KeyShape], finishing: bool) -> list[_Rule]:
    """The rules of the names of ``kind`` (``column``: the job's column they match)."""
    k = f"k_{kind}"
    of = f"{'handler' if kind == 'h' else 'queue'}."

    def keys_row(row: str, condition: str) -> str:
        return (
            f"EXISTS (SELECT 1 FROM keys AS {k} WHERE {k}.kind = '{kind}'"
            f" AND {k}.name = {row}.{column} AND {condition})"
        )

    rules = []
    if any(s.max_running for s in shapes):
        rules.append(
            _Rule(
                of + "max_running",
                f"{keys_row('{row}', f'{k}.room < 1')}",
                f"({k}.room IS NULL OR r.n_{kind} <= {k}.room)",
            )
        )
    if any(s.per_scope for s in shapes):
        used = _used(f"{k}.key || ':' || {{row}}.scope_hash", finishing)
        rules.append(
            _Rule(
                of + "max_running_per_scope",
                keys_row("{row}", f"{k}.scope IS NOT NULL AND {used} >= {k}.scope"),
                f"({k}.scope IS NULL OR r.n_{kind}s + {used.format(row='r')} <= {k}.scope)",
            )
        )
    if any(s.per_key for s in shapes):
        used = _used(f"{k}.key || '#' || {{row}}.limit_key", finishing)
        rules.append(
            _Rule(
                of + "max_running_per_key",
                keys_row(
                    "{row}",
                    f"{k}.keyed IS NOT NULL AND {{row}}.limit_key <> '' AND {used} >= {k}.keyed",
                ),
                f"({k}.keyed IS NULL OR r.limit_key = ''"
                f" OR r.n_{kind}k + {used.format(row='r')} <= {k}.keyed)",
            )
        )
    if any(s.rate for s in shapes):
        units = _units("{row}", f"{k}.r_cap")
        rules.append(
            _Rule(
                of + "rate",
                keys_row("{row}", f"{k}.units < {units}"),
                f"({k}.units IS NULL OR r.u_{kind} <= {k}.units)",
            )
        )
    if any(s.rate_per_key for s in shapes):
        cap = f"COALESCE({k}.rk_burst, {k}.rk_count)"
        rules.append(
            _Rule(
                of + "rate_per_key",
                keys_row(
                    "{row}",
                    f"{cap} IS NOT NULL AND {{row}}.limit_key <> ''"
                    f" AND {_key_room(kind, '{row}')} < {_units('{row}', cap)}",
                ),
                f"({cap} IS NULL OR r.limit_key = '' OR r.u_{kind}k <= {_key_room(kind, 'r')})",
            )
        )
    return rules


def _key_row(n: int, shape: KeyShape, finishing: bool) -> str:
    """The ``keys`` row of name ``n``: its kind, name and key; ``room``, the starts
    ``max_running`` still allows; ``units``, the units its rate still lets start;
    its per-scope and per-key limits and cap; its rate's capacity (``r_cap``) and
    its per-key rate (``rk_…``)."""
    key = f"%(lim_{n}_key)s::text"
    param = f"%(lim_{n}_{{}})s::bigint".format
    room = f"{param('max')} - {_used(key, finishing)}" if shape.max_running else _NULL
    count, burst, t, span = _rate_values(n, "r", shape.rate)
    units = _room(key, count, burst, t, span) if shape.rate else _NULL
    rk = _rate_values(n, "rk", shape.rate_per_key)
    values = [
        f"'{shape.kind}'::text",
        f"%(lim_{n})s::text",
        key,
        room,
        units,
        param("scope") if shape.per_scope else _NULL,
        param("pkey") if shape.per_key else _NULL,
        param("max") if shape.max_running else _NULL,
        f"COALESCE({burst}, {count})",
        *rk,
    ]
    return f"({', '.join(values)})"


_KEY_COLUMNS = (
    "kind, name, key, room, units, scope, keyed, cap, r_cap, rk_count, rk_burst, rk_t, rk_span"
)


def _ranks(kind: str, column: str, shapes: list[KeyShape]) -> list[str]:
    """The window functions ``ranked`` needs for the names of ``kind``: the rank of a
    candidate among those of its name (``n_``), of its (name, scope) and (name, limit
    key) pairs (``n_…s``, ``n_…k``), and the running sums of units of its name's rate
    and its key's (``u_``, ``u_…k``)."""
    k = f"k_{kind}"
    ranks = []
    if any(s.max_running for s in shapes):
        ranks.append(f"row_number() OVER (PARTITION BY c.{column} ORDER BY {_ORDER}) AS n_{kind}")
    if any(s.per_scope for s in shapes):
        ranks.append(
            f"row_number() OVER (PARTITION BY c.{column}, c.scope_hash ORDER BY {_ORDER})"
            f" AS n_{kind}s"
        )
    if any(s.per_key for s in shapes):
        ranks.append(
            f"row_number() OVER (PARTITION BY c.{column}, c.limit_key ORDER BY {_ORDER})"
            f" AS n_{kind}k"
        )
    if any(s.rate for s in shapes):
        ranks.append(
            f"sum({_units('c', f'COALESCE({k}.r_cap, 1)')}) OVER (PARTITION BY c.{column}"
            f" ORDER BY {_ORDER}) AS u_{kind}"
        )
    if any(s.rate_per_key for s in shapes):
        cap = f"COALESCE({k}.rk_burst, {k}.rk_count, 1)"
        ranks.append(
            f"sum({_units('c', cap)}) OVER (PARTITION BY c.{column}, c.limit_key"
            f" ORDER BY {_ORDER}) AS u_{kind}k"
        )
    return ranks


#: The columns of the exact claim's candidates, and of the first due jobs it reports on.
_FIRST = ("id", "handler", "queue", "scope_hash", "limit_key", "cost")
_CANDIDATE = (*_FIRST, "priority", "fair_at")


@functools.lru_cache(maxsize=64)
def limited_claim(
    *, queues: int, one_job: bool, finishing: bool, keys: tuple[KeyShape, ...]
) -> str:
    """PostgreSQL: a claim under limits that binds, as one statement — rooms,
    choice, claim and the changes of the limits' rows — to run after the advisory
    locks of the binding names (:data:`LOCK_KEYS`), so that its snapshot, taken when
    it starts, sees every claim the locks' previous holders committed. Claims that
    take no lock are kept off by the rows' constraints, as in :func:`counted_claim`.

    Parameters as for :func:`counted_claim`. In the statement: ``freed`` — with
    ``finishing``, the counts the jobs it finishes give back; ``keys`` — per limited
    name, its ``room`` (the starts ``max_running`` still allows), ``units`` (the units
    its rate still lets start) and its other limits; ``candidates`` — up to ``limit``
    due jobs in claim order, locked (``SKIP LOCKED``), leaving out every job whose
    name, (name, scope) or (name, limit key) has no room left for it (no head of line
    blocks: the jobs behind them are candidates); ``ranked`` — each candidate's rank
    and running sum of units among those of its name and of its pairs, and the first
    rule that ``refused`` it (a claim never takes more than any room, and may take
    fewer where one limit's refusal leaves another's room unused); ``chosen``, the
    rest; the claim's update of the chosen jobs (locked, so their guard still holds)
    and attempt rows, the counters and the rate rows; and ``first``: the first
    ``limit`` due jobs a claim without limits would take, unlocked.

    Returns the rows of :func:`jobs.store.sql.claim` with ``finishing`` (a ``kind``
    per row); a row of kind ``'skipped'`` when a limit refused a candidate (a claim of
    the rest may find jobs past it); and rows of kind ``'held'``: per ``queue``,
    ``handler`` and ``rule``, the ``n`` jobs of ``first`` left Queued by that rule."""
    ctes = [
        "keys AS (SELECT * FROM (VALUES "
        + ", ".join(_key_row(n, shape, finishing) for n, shape in enumerate(keys))
        + f") AS k({_KEY_COLUMNS}))",
    ]
    if finishing:
        ctes.insert(0, _freed())
    rules: list[_Rule] = []
    ranks: list[str] = []
    joins = []
    for kind, column in _KINDS:
        shapes = [shape for shape in keys if shape.kind == kind]
        if not shapes:
            continue
        rules += _rules(kind, column, shapes, finishing)
        ranks += _ranks(kind, column, shapes)
        joins.append(
            f" LEFT JOIN keys AS k_{kind} ON k_{kind}.kind = '{kind}'"
            f" AND k_{kind}.name = {{row}}.{column}"
        )
    joined = "".join(joins)
    excluded = [f"NOT {rule.excludes.format(row=JOB)}" for rule in rules]
    # A queue whose own limit has no room left is not read at all.
    closed = (
        "NOT EXISTS (SELECT 1 FROM keys AS k WHERE k.kind = 'q' AND k.name = l.name"
        " AND (k.room < 1 OR k.units < 1))"
        if any(shape.kind == "q" for shape in keys)
        else ""
    )
    ctes.append(
        "candidates AS ("
        + in_line(
            "postgresql",
            queues=queues,
            one_job=one_job,
            columns=_CANDIDATE,
            filters=excluded,
            exclude=closed,
        )
        + ")"
    )
    refused = " ".join(f"WHEN NOT {rule.admits} THEN '{rule.label}'" for rule in rules)
    ctes.append(
        f"ranks AS (SELECT c.*, {', '.join(ranks)} FROM candidates AS c{joined.format(row='c')})"
    )
    ctes.append(
        f"ranked AS (SELECT r.id, CASE {refused} END AS refused"
        f" FROM ranks AS r{joined.format(row='r')})"
    )
    ctes.append("chosen AS (SELECT id FROM ranked WHERE refused IS NULL)")
    orphans = "NOT EXISTS (SELECT 1 FROM orphans) AND " if finishing else ""
    # The candidates are locked by this statement: their guard holds still.
    update = claim_update(
        "postgresql",
        f"{orphans}id = ANY(ARRAY(SELECT id FROM chosen)) AND status = '{QUEUED}'",
        counted=_counted(keys),
    )
    ctes.append(claimed_ctes(update))
    ctes += _changes(keys, finishing)
    if finishing:
        ctes.insert(0, finish_ctes())
    # What held back the jobs a claim without limits would have taken.
    first = in_line("postgresql", queues=queues, one_job=one_job, columns=_FIRST, lock=False)
    ctes.append(f"first AS ({first})")
    excluding = " ".join(
        f"WHEN {rule.excludes.format(row='f')} THEN '{rule.label}'" for rule in rules
    )
    ctes.append(
        "held AS (SELECT f.queue, f.handler,"
        f" COALESCE(r.refused, CASE {excluding} END) AS rule"
        " FROM first AS f LEFT JOIN ranked AS r ON r.id = f.id"
        " WHERE NOT EXISTS (SELECT 1 FROM chosen WHERE chosen.id = f.id))"
    )
    skipped = "(SELECT 1 WHERE EXISTS (SELECT 1 FROM ranked WHERE refused IS NOT NULL)) AS s"
    held = (
        "(SELECT queue AS held_queue, handler AS held_handler, rule, count(*) AS n FROM held"
        " WHERE rule IS NOT NULL GROUP BY 1, 2, 3) AS h"
    )
    columns = {"queue": "held_queue", "handler": "held_handler", "rule": "rule", "n": "n"}
    return f"WITH {', '.join(ctes)} " + union_by_kind(
        [*claimed_kinds(finishing=finishing), ("held", held, columns), ("skipped", skipped, {})],
        # Typed where the other kinds have none: a union resolves its types left to right.
        {"rule": "text", "n": "bigint"},
    )


# --------------------------------------------------------------------------- SQLite


@functools.lru_cache(maxsize=64)
def usage(handlers: int, queues: int) -> str:
    """SQLite: the Running jobs that limits count, per ``handler``, ``queue``,
    ``scope_hash`` and ``limit_key``, in ``n``: those of ``handlers`` limited handler
    names (``lim_handler_0``…) or ``queues`` limited queues (``lim_queue_0``…). Only
    Running jobs hold a current token: the small partial index of tokens serves it."""
    either = []
    if handlers:
        either.append(f"handler IN ({in_list('lim_handler', handlers)})")
    if queues:
        either.append(f"queue IN ({in_list('lim_queue', queues)})")
    return (
        f"SELECT handler, queue, scope_hash, limit_key, count(*) AS n FROM {JOB}"
        f" WHERE current_token IS NOT NULL AND status = '{RUNNING}'"
        f" AND ({' OR '.join(either)}) GROUP BY handler, queue, scope_hash, limit_key"
    )


@functools.lru_cache(maxsize=64)
def read_rates(keys: int) -> str:
    """SQLite: the rows of ``keys`` rate keys (``key_0``…): ``key``, ``tat`` and
    ``stamps`` (JSON text)."""
    return f"SELECT key, tat, stamps FROM {RATE} WHERE key IN ({in_list('key', keys)})"


#: A rate row's columns as a claim writes them (see :func:`write_rates`).
RATE_COLUMNS = ("key", "tat", "horizon", "stamps", "used", "cap", "window_start", "ends")


@functools.lru_cache(maxsize=64)
def write_rates(rows: int) -> str:
    """SQLite: ``rows`` rate rows as the claim computed them (:func:`jobs.db.numbered`
    parameters of :data:`RATE_COLUMNS`), written over the rows read in the same
    transaction. The rows' constraints still hold them to their rates."""
    updates = ", ".join(f"{name} = excluded.{name}" for name in RATE_COLUMNS[1:])
    return (
        f"INSERT INTO {RATE} ({', '.join(RATE_COLUMNS)}) VALUES {values_of(RATE_COLUMNS, rows)}"
        f" ON CONFLICT (key) DO UPDATE SET {updates}"
    )


@functools.lru_cache(maxsize=256)
def candidates(
    *,
    queues: int,
    one_job: bool,
    full_handlers: int = 0,
    full_queues: int = 0,
    full_handler_scopes: int = 0,
    full_queue_scopes: int = 0,
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
    ``scope_hash``, ``limit_key`` and ``cost``. SQLite (whose claims hold the write
    lock)."""
    filters = []
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
    # Each queue's line from its head, as every claim reads it (jobs.store.sql.in_line).
    return in_line("sqlite", queues=queues, one_job=one_job, columns=_FIRST, filters=filters)


#: The rate rows that hold nothing since before ``before`` (nanoseconds): a full
#: bucket, an empty window — the same as no row.
PRUNE_RATES = f"DELETE FROM {RATE} WHERE ends < %(before)s"
