"""Claims under limits: ``max_running``, ``max_running_per_scope`` and ``rate``
per handler name and per queue, exact across every worker and machine.

**PostgreSQL: one round trip.** A claim that a limit may apply to sends, in one
pipeline (:func:`claim_locked`), its transaction's ``BEGIN``; one statement that
takes a transaction-scoped advisory lock (``pg_advisory_xact_lock``) for every
limited handler and queue it may touch, in one order; the claim itself, one
statement (:func:`jobs.store.sql_flow.limited_claim`); and ``COMMIT``. The server
runs them one after the other: under READ COMMITTED the claim's statement takes
its snapshot when it starts — after the locks are held — so it sees every claim
committed by the locks' previous holders, and the commit releases the locks. (A
single statement that took the locks itself would count in a snapshot taken
before it waited for them, and could over-claim.) Inside the statement:

1. the usage: the Running jobs of the limited handlers and queues, less those the
   same statement finishes, and per rate key the starts after ``now -
   seconds`` (``jobs_claimstart``);
2. the candidates: up to ``limit`` due jobs in claim order, locked with ``SKIP
   LOCKED``, leaving out the handlers and queues without room and the (name,
   scope) pairs at their per-scope limit — no head of line blocks: jobs past them
   are claimed;
3. the choice: a candidate is taken when, for each of its keys, its rank among the
   candidates of that key is within the key's room; a claim never takes more than
   a room, and limits that do not bind refuse nothing (the plain claim's choice);
4. the claim's update and attempt rows, and one ``jobs_claimstart`` row per start
   of a rate-limited key.

When a limit refused a candidate and the claim is short, it goes on in a
transaction of its own with the rest (the keys that filled are now left out of the
candidates); each such claim takes at least the first candidate, so they end.

**SQLite** serialises every writer already: the transaction is ``BEGIN
IMMEDIATE``, which holds the database's write lock from its first statement
(``transaction_mode: IMMEDIATE``, checked by ``ledon.W001``). In it the claim
reads the usage (:func:`read_usage`); if ``limit`` more starts of any jobs keep
every limit it claims as a claim without limits does, else it picks due jobs in
claim order that keep every limit, page by page (:func:`choose`), claims them by
id and records the rate starts (:func:`record_starts`).

Ends of Running attempts take no lock: they only free capacity, so a claim that
misses one under-claims for one cycle and never over-claims. ``rate=(count,
seconds)`` counts every start after ``now - seconds``, even one a claimer with a later
clock committed: whatever the order in which claimers' clocks and locks go, no window
of ``seconds`` ever holds more than ``count`` starts.

Fault point (:func:`ledon.faults.fault_point`; ``limited``: the number of limited
keys): ``jobs.claim.limited`` — a claim under limits begins, no transaction open yet.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import adapt_dt

from ..db import fetch, fetch_results, in_list_params
from ..flow_control import ClaimLimits, Limits
from ..types import Claim
from . import sql_flow

#: Rate starts are pruned this long after their window ended: a margin for workers
#: whose clocks run behind (see :func:`prune_claim_starts`).
PRUNE_MARGIN = timedelta(minutes=5)

#: A key of the usage: ("h", handler), ("q", queue), ("hs", handler, scope),
#: ("qs", queue, scope), ("hk", handler, limit key) or ("qk", queue, limit key).
Key = tuple[str, ...]


def rate_key(kind: str, name: str) -> str:
    """The ``jobs_claimstart.key`` of a handler's or a queue's rate."""
    return f"{kind}:{name}"


def lock_id(kind: str, name: str) -> int:
    """The advisory lock of a handler's or a queue's limits: 64 bits of a hash."""
    digest = hashlib.sha256(f"jobs.limits:{kind}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lock_ids(limits: ClaimLimits) -> list[int]:
    """The advisory locks of ``limits``' handlers and queues, in the one order every
    claimer takes them."""
    return sorted(
        {lock_id("handler", name) for name in limits.handlers}
        | {lock_id("queue", name) for name in limits.queues}
    )


def claim_keys(
    connection: BaseDatabaseWrapper, limits: ClaimLimits, now: datetime
) -> tuple[tuple[sql_flow.KeyShape, ...], dict[str, Any]]:
    """PostgreSQL: the keys of :func:`jobs.store.sql_flow.limited_claim` — every
    limited handler name, then every limited queue, each in name order — and their
    parameters, with the advisory locks' ``keys`` (:func:`lock_ids`)."""
    shapes: list[sql_flow.KeyShape] = []
    params: dict[str, Any] = {"keys": lock_ids(limits)}
    for kind, configured in (("h", limits.handlers), ("q", limits.queues)):
        for name in sorted(configured):
            value, n = configured[name], len(shapes)
            shapes.append(
                (
                    kind,
                    value.max_running is not None,
                    value.max_running_per_scope is not None,
                    value.rate is not None,
                    value.max_running_per_key is not None,
                )
            )
            params[f"lim_{n}"] = name
            params[f"lim_{n}_key"] = rate_key(_KINDS[kind], name)
            if value.max_running is not None:
                params[f"lim_{n}_max"] = value.max_running
            if value.max_running_per_scope is not None:
                params[f"lim_{n}_scope"] = value.max_running_per_scope
            if value.max_running_per_key is not None:
                params[f"lim_{n}_pkey"] = value.max_running_per_key
            if value.rate is not None:
                count, seconds = value.rate
                params[f"lim_{n}_rate"] = count
                params[f"lim_{n}_since"] = adapt_dt(connection, now - timedelta(seconds=seconds))
    return tuple(shapes), params


def claim_locked(
    connection: BaseDatabaseWrapper, statement: str, params: dict[str, Any], *, commit: bool
) -> list[dict[str, Any]]:
    """PostgreSQL, in one round trip: the advisory locks of ``params['keys']``, then
    ``statement`` (a :func:`jobs.store.sql_flow.limited_claim`, prepared), then — with
    ``commit``, the transaction being the claim's own — ``COMMIT``. Each statement
    runs when the one before it has finished, with a snapshot of its own: the claim's
    sees every claim the locks' previous holders committed. Returns its rows."""
    statements = [sql_flow.LOCK_KEYS, statement]
    if commit:
        statements.append(sql_flow.COMMIT)
    return fetch_results(connection, statements, params, prepare=statements[:2])[1]


@dataclass(slots=True)
class Job:
    """A candidate: what its limits are keyed by."""

    id: int
    handler: str
    queue: str
    scope_hash: str
    limit_key: str


@dataclass(slots=True)
class Usage:
    """What the limits allow now: Running counts and recent starts, kept current as
    the claim picks jobs."""

    limits: ClaimLimits
    running: Counter[Key] = field(default_factory=Counter)
    started: Counter[str] = field(default_factory=Counter)

    def _checks(self, job: Job) -> Iterable[tuple[Counter[Any], Any, int]]:
        for kind, name, limits in (
            ("h", job.handler, self.limits.handlers.get(job.handler)),
            ("q", job.queue, self.limits.queues.get(job.queue)),
        ):
            if limits is None:
                continue
            if limits.max_running is not None:
                yield self.running, (kind, name), limits.max_running
            if limits.max_running_per_scope is not None:
                yield self.running, (kind + "s", name, job.scope_hash), limits.max_running_per_scope
            if limits.max_running_per_key is not None and job.limit_key:
                yield self.running, (kind + "k", name, job.limit_key), limits.max_running_per_key
            if limits.rate is not None:
                yield self.started, rate_key(_KINDS[kind], name), limits.rate[0]

    def admits(self, job: Job) -> bool:
        return all(counter[key] < limit for counter, key, limit in self._checks(job))

    def take(self, job: Job) -> None:
        """Count ``job`` as started."""
        for counter, key, _limit in self._checks(job):
            counter[key] += 1

    def room_for(self, count: int) -> bool:
        """Whether ``count`` more starts of any jobs keep every limit — each key
        gains at most ``count``: then the claim need not pick (the plain claim's
        choice, in the same transaction, keeps them all)."""
        for kind, configured in (("h", self.limits.handlers), ("q", self.limits.queues)):
            for name, limits in configured.items():
                if (
                    limits.max_running is not None
                    and self.running[(kind, name)] + count > limits.max_running
                ):
                    return False
                for suffix, limit in (
                    ("s", limits.max_running_per_scope),
                    ("k", limits.max_running_per_key),
                ):
                    if limit is None:
                        continue
                    busiest = max(
                        (n for key, n in self.running.items() if key[:2] == (kind + suffix, name)),
                        default=0,
                    )
                    if busiest + count > limit:
                        return False
                if (
                    limits.rate is not None
                    and self.started[rate_key(_KINDS[kind], name)] + count > limits.rate[0]
                ):
                    return False
        return True

    def full(self) -> dict[str, list[Any]]:
        """What is at a limit: handlers, queues, (name, scope) pairs — the candidates'
        exclusions (see :func:`jobs.store.sql_flow.candidates`)."""
        out: dict[str, list[Any]] = {
            "fh": [],
            "fq": [],
            "fhs": [],
            "fqs": [],
            "fhk": [],
            "fqk": [],
        }
        for kind, prefix, configured in (
            ("h", "fh", self.limits.handlers),
            ("q", "fq", self.limits.queues),
        ):
            for name, limits in configured.items():
                at_max = (
                    limits.max_running is not None
                    and self.running[(kind, name)] >= limits.max_running
                )
                at_rate = (
                    limits.rate is not None
                    and self.started[rate_key(_KINDS[kind], name)] >= limits.rate[0]
                )
                if at_max or at_rate:
                    out[prefix].append(name)
                for suffix, limit in (
                    ("s", limits.max_running_per_scope),
                    ("k", limits.max_running_per_key),
                ):
                    if limit is None:
                        continue
                    out[prefix + suffix].extend(
                        (key[1], key[2])
                        for key, count in self.running.items()
                        if key[0] == kind + suffix and key[1] == name and count >= limit
                    )
        return out


_KINDS = {"h": "handler", "q": "queue"}


def _usage_statement(
    connection: BaseDatabaseWrapper, limits: ClaimLimits, now: datetime
) -> tuple[str, dict[str, Any]]:
    handlers, queues = list(limits.handlers), list(limits.queues)
    windows = _rate_windows(limits)
    params: dict[str, Any] = {
        **in_list_params("lim_handler", handlers),
        **in_list_params("lim_queue", queues),
    }
    for n, (key, seconds) in enumerate(windows.items()):
        params[f"key_{n}"] = key
        params[f"since_{n}"] = adapt_dt(connection, now - timedelta(seconds=seconds))
    return sql_flow.usage(len(handlers), len(queues), len(windows)), params


def read_usage(connection: BaseDatabaseWrapper, limits: ClaimLimits, now: datetime) -> Usage:
    """SQLite: the Running jobs and recent starts that ``limits`` count, in one
    statement."""
    statement, params = _usage_statement(connection, limits, now)
    return _usage_of(limits, fetch(connection, statement, params))


def _usage_of(limits: ClaimLimits, rows: Iterable[dict[str, Any]]) -> Usage:
    usage = Usage(limits)
    for row in rows:
        if row["kind"] == "started":
            usage.started[row["key"]] = row["n"]
            continue
        for kind, name, configured in (
            ("h", row["handler"], limits.handlers),
            ("q", row["queue"], limits.queues),
        ):
            if name in configured:
                usage.running[(kind, name)] += row["n"]
                usage.running[(kind + "s", name, row["scope_hash"])] += row["n"]
                if row["limit_key"]:
                    usage.running[(kind + "k", name, row["limit_key"])] += row["n"]
    return usage


def _rate_windows(limits: ClaimLimits) -> dict[str, float]:
    windows = {}
    for kind, configured in (("handler", limits.handlers), ("queue", limits.queues)):
        for name, value in configured.items():
            if value.rate is not None:
                windows[rate_key(kind, name)] = value.rate[1]
    return windows


def choose(
    connection: BaseDatabaseWrapper,
    usage: Usage,
    *,
    limit: int,
    base_params: dict[str, Any],
    queues: int,
    one_job: bool,
) -> list[int]:
    """Pick up to ``limit`` due jobs that keep every limit (see the module's
    docstring); returns their ids, in claim order.

    Each page asks for as many jobs as are still wanted; a job skipped means a key
    filled up while picking, which the next page leaves out — so the pages end after
    at most one more than the number of limited keys.
    """
    chosen: list[int] = []
    seen: set[int] = set()
    while len(chosen) < limit:
        wanted = limit - len(chosen)
        full = usage.full()
        params: dict[str, Any] = {**base_params, "limit": wanted}
        params.update(in_list_params("fh", full["fh"]))
        params.update(in_list_params("fq", full["fq"]))
        params.update(in_list_params("seen", sorted(seen)))
        for prefix in ("fhs", "fqs", "fhk", "fqk"):
            for n, (name, scope) in enumerate(full[prefix]):
                params[f"{prefix}_k_{n}"] = name
                params[f"{prefix}_s_{n}"] = scope
        statement = sql_flow.candidates(
            queues=queues,
            one_job=one_job,
            full_handlers=len(full["fh"]),
            full_queues=len(full["fq"]),
            full_handler_scopes=len(full["fhs"]),
            full_queue_scopes=len(full["fqs"]),
            full_handler_keys=len(full["fhk"]),
            full_queue_keys=len(full["fqk"]),
            seen=len(seen),
        )
        rows = [Job(**row) for row in fetch(connection, statement, params)]
        skipped = False
        for job in rows:
            seen.add(job.id)
            if usage.admits(job):
                usage.take(job)
                chosen.append(job.id)
            else:
                skipped = True
        if len(rows) < wanted or not skipped:
            break
    return chosen


def record_starts(
    connection: BaseDatabaseWrapper, limits: ClaimLimits, claims: Sequence[Claim], now: datetime
) -> None:
    """One ``jobs_claimstart`` row per start of a rate-limited handler or queue, at
    ``now`` (the claims' start time)."""
    keys = []
    for claim in claims:
        for kind, name, configured in (
            ("handler", claim.handler, limits.handlers),
            ("queue", claim.queue, limits.queues),
        ):
            value = configured.get(name)
            if value is not None and value.rate is not None:
                keys.append(rate_key(kind, name))
    if keys:
        params = {f"key_{n}": key for n, key in enumerate(keys)}
        fetch(
            connection,
            sql_flow.insert_claim_starts(len(keys)),
            {**params, "now": adapt_dt(connection, now)},
        )


def prune_claim_starts(
    connection: BaseDatabaseWrapper, limits: Iterable[Limits], now: datetime
) -> int:
    """Delete the starts that no rate window of ``limits`` can count any more (with
    :data:`PRUNE_MARGIN`); returns how many."""
    longest = max((value.rate[1] for value in limits if value.rate is not None), default=0.0)
    before = now - timedelta(seconds=longest) - PRUNE_MARGIN
    with connection.cursor() as cursor:
        cursor.execute(sql_flow.PRUNE_CLAIM_STARTS, {"before": adapt_dt(connection, before)})
        return max(int(cursor.rowcount), 0)
