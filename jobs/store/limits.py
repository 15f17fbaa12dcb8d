"""Claims under limits: ``max_running``, ``max_running_per_scope``,
``max_running_per_key``, ``rate`` and ``rate_per_key`` per handler name and per queue,
exact across every worker and machine.

Each limit a job falls under is one row: a counter of Running jobs
(``jobs_limitcounter``: ``handler:<name>``, with ``:<scope hash>`` or ``#<limit key>``
appended, likewise ``queue:``) or a rate (``jobs_ratebucket``, the same keys; see
:mod:`jobs.store.rates`). No key is ever scanned: a key's usage is its row.

**PostgreSQL, optimistically first.** A claim under limits is first made as the plain
claim makes it — the first due jobs, ``SKIP LOCKED``, no lock and no usage read — with
one upsert of each touched counter and rate row in the same statement
(:func:`jobs.store.sql_limits.counted_claim`). Each row's constraint refuses a
statement that would take it past its limit: the statement fails whole and nothing
happened. Limits that do not bind cost these upserts, nothing more.

**Then exactly.** When a constraint refused, the claim is made again in one round
trip (:func:`claim_locked`): its transaction's ``BEGIN``; the transaction-scoped
advisory locks (``pg_advisory_xact_lock``) of the binding handlers and queues only,
in one order; one statement that reads the rows of the candidates' keys, leaves out
the candidates whose limits have no room (the jobs behind them stay candidates),
ranks the rest, takes those within each room and changes the rows
(:func:`jobs.store.sql_limits.limited_claim`); and ``COMMIT``. Under READ COMMITTED the
statement takes its snapshot when it starts — after the locks are held — so it sees
every claim the locks' previous holders committed; a claim that took no lock is kept
off by the rows' constraints as before. A worker whose last claim bound makes its next
one the exact way at once (:class:`Binding`), so that a binding limit does not cost
two statements per claim; once a claim holds nothing back, the next is optimistic
again. Which names bind is known from the constraint that refused (the names with a
limit of its kind) and then from the exact claim's ``held`` rows.

When a limit refused a candidate and the claim is short, it goes on in a transaction
of its own with the rest (the keys that filled are now left out of the candidates);
each such claim takes at least the first candidate, so they end.

**SQLite** serialises every writer already: the transaction is ``BEGIN IMMEDIATE``,
which holds the database's write lock from its first statement (``transaction_mode:
IMMEDIATE``, checked by ``ledon.W001``). In it the claim reads the Running jobs the
counted limits count and the rows of the rates (:func:`read_usage`); if ``limit`` more
starts of any jobs keep every limit it claims as a claim without limits does, else it
picks due jobs in claim order that keep every limit, page by page, reading the rate
rows of the candidates' keys by key (:func:`choose`), by the same rule; then it claims
them by id and writes the rate rows back.

Ends of Running attempts take no lock: they only free capacity, so a claim that
misses one under-claims for one cycle and never over-claims. A rate counts every start
in its row, even one a claimer with a later clock made: whatever the order in which
claimers' clocks and commits go, no rate ever admits more than it allows.

Fault point (:func:`ledon.faults.fault_point`; ``limited``: the number of limited
keys): ``jobs.claim.limited`` — a claim under limits begins, no transaction open yet.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..db import fetch, fetch_results, in_list_params
from ..flow_control import ClaimLimits, Limits, Rate
from . import sql_limits
from .rates import RateState, nanoseconds, rate_key, read_states, units_of

#: A key of the counted usage: ("h", handler), ("q", queue), ("hs", handler, scope),
#: ("qs", queue, scope), ("hk", handler, limit key) or ("qk", queue, limit key).
Key = tuple[str, ...]

#: A limited name: ``("handler", name)`` or ``("queue", name)``.
Name = tuple[str, str]

_KINDS = {"h": "handler", "q": "queue"}


def lock_id(kind: str, name: str) -> int:
    """The advisory lock of a handler's or a queue's limits: 64 bits of a hash."""
    digest = hashlib.sha256(f"jobs.limits:{kind}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lock_ids(names: Iterable[Name]) -> list[int]:
    """The advisory locks of ``names``, in the one order every claimer takes them."""
    return sorted({lock_id(kind, name) for kind, name in names})


def _each(limits: ClaimLimits) -> Iterator[tuple[str, str, Limits]]:
    """Every limited name of ``limits``: handlers, then queues, each in name order —
    the order of a claim's keys."""
    for kind, configured in (("h", limits.handlers), ("q", limits.queues)):
        for name in sorted(configured):
            yield kind, name, configured[name]


def _rate_kind(rate: Rate | None) -> str:
    if rate is None:
        return ""
    return "window" if rate.burst is None else "bucket"


def _rate_params(params: dict[str, Any], prefix: str, rate: Rate) -> None:
    if rate.burst is None:
        params[f"{prefix}_count"] = rate.count
        params[f"{prefix}_span"] = rate.span_ns()
        params[f"{prefix}_grain"] = rate.quantum_ns()
    else:
        params[f"{prefix}_burst"] = rate.burst
        params[f"{prefix}_t"] = rate.interval_ns()


def claim_keys(
    limits: ClaimLimits, now: datetime
) -> tuple[tuple[sql_limits.KeyShape, ...], dict[str, Any]]:
    """PostgreSQL: the keys of :func:`jobs.store.sql_limits.counted_claim` and
    :func:`~jobs.store.sql_limits.limited_claim` — every limited handler name, then
    every limited queue, each in name order — and their parameters."""
    shapes: list[sql_limits.KeyShape] = []
    params: dict[str, Any] = {"now_ns": nanoseconds(now)}
    for kind, name, value in _each(limits):
        n = len(shapes)
        shapes.append(
            sql_limits.KeyShape(
                kind,
                max_running=value.max_running is not None,
                per_scope=value.max_running_per_scope is not None,
                per_key=value.max_running_per_key is not None,
                rate=_rate_kind(value.rate),
                rate_per_key=_rate_kind(value.rate_per_key),
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
            _rate_params(params, f"lim_{n}_r", value.rate)
        if value.rate_per_key is not None:
            _rate_params(params, f"lim_{n}_rk", value.rate_per_key)
    return tuple(shapes), params


def claim_locked(
    connection: BaseDatabaseWrapper,
    statement: str,
    params: dict[str, Any],
    *,
    locks: list[int],
    commit: bool,
) -> list[dict[str, Any]]:
    """PostgreSQL, in one round trip: the advisory locks ``locks`` (if any), then
    ``statement`` (a :func:`jobs.store.sql_limits.limited_claim`, prepared), then —
    with ``commit``, the transaction being the claim's own — ``COMMIT``. Each
    statement runs when the one before it has finished, with a snapshot of its own:
    the claim's sees every claim the locks' previous holders committed. Returns its
    rows."""
    statements = [sql_limits.LOCK_KEYS] if locks else []
    statements.append(statement)
    if commit:
        statements.append(sql_limits.COMMIT)
    prepared = statements[: len(statements) - commit]
    results = fetch_results(connection, statements, {**params, "keys": locks}, prepare=prepared)
    return results[1 if locks else 0]


# --------------------------------------------------------------------------- binding


@dataclass(slots=True)
class Binding:
    """Which limited names bound the last claim of this process under the same limits,
    per database alias: its next claim is made the exact way at once, under their
    locks. Forgotten when the limits change, or a claim holds nothing back."""

    names: dict[str, tuple[ClaimLimits, frozenset[Name]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, alias: str, limits: ClaimLimits) -> frozenset[Name]:
        known = self.names.get(alias)
        return known[1] if known is not None and known[0] == limits else frozenset()

    def bound(self, alias: str, limits: ClaimLimits, names: Iterable[Name]) -> None:
        """The last claim under ``limits`` held jobs back under ``names`` (none: it
        bound nowhere)."""
        with self.lock:
            found = frozenset(names)
            if found:
                self.names[alias] = (limits, found)
            else:
                self.names.pop(alias, None)

    def forget(self) -> None:
        with self.lock:
            self.names.clear()


#: This process's :class:`Binding`.
binding = Binding()


def names_of_kind(limits: ClaimLimits, *, counted: bool, rated: bool) -> list[Name]:
    """The limited names with a counted limit (``counted``) or a rate (``rated``): those
    that may bind when a counter's or a rate row's constraint refused a claim."""
    return [
        (_KINDS[kind], name)
        for kind, name, value in _each(limits)
        if (counted and value.counted) or (rated and (value.rate or value.rate_per_key))
    ]


@dataclass(frozen=True, slots=True)
class Held:
    """Jobs a claim left Queued because of one rule: ``count`` jobs of ``handler`` in
    ``queue`` held by ``rule`` (``handler.max_running``, ``queue.rate_per_key``…)."""

    queue: str
    handler: str
    rule: str
    count: int

    @property
    def name(self) -> Name:
        """The limited name whose rule held them."""
        kind = self.rule.split(".", 1)[0]
        return kind, self.handler if kind == "handler" else self.queue


def held_of(rows: Iterable[dict[str, Any]]) -> list[Held]:
    """The ``held`` rows of :func:`jobs.store.sql_limits.limited_claim`."""
    return [
        Held(row["queue"], row["handler"], row["rule"], int(row["n"]))
        for row in rows
        if row["kind"] == "held"
    ]


# --------------------------------------------------------------------------- SQLite


@dataclass(slots=True)
class Job:
    """A candidate: what its limits are keyed by."""

    id: int
    handler: str
    queue: str
    scope_hash: str
    limit_key: str
    cost: int


@dataclass(slots=True)
class Usage:
    """What the limits allow now: Running counts and the rates' rows, kept current as
    the claim picks jobs. The per-key rates' rows are read as their keys show up
    (:meth:`load`)."""

    limits: ClaimLimits
    now: int
    running: Counter[Key] = field(default_factory=Counter)
    rates: dict[str, RateState] = field(default_factory=dict)

    def _named(self, job: Job) -> Iterator[tuple[str, str, Limits]]:
        for kind, name, configured in (
            ("h", job.handler, self.limits.handlers),
            ("q", job.queue, self.limits.queues),
        ):
            limits = configured.get(name)
            if limits is not None:
                yield kind, name, limits

    def _counted(self, job: Job) -> Iterator[tuple[str, Key, int]]:
        for kind, name, limits in self._named(job):
            of = _KINDS[kind]
            if limits.max_running is not None:
                yield f"{of}.max_running", (kind, name), limits.max_running
            if limits.max_running_per_scope is not None:
                yield (
                    f"{of}.max_running_per_scope",
                    (kind + "s", name, job.scope_hash),
                    limits.max_running_per_scope,
                )
            if limits.max_running_per_key is not None and job.limit_key:
                yield (
                    f"{of}.max_running_per_key",
                    (kind + "k", name, job.limit_key),
                    limits.max_running_per_key,
                )

    def _rated(self, job: Job) -> Iterator[tuple[str, str, Rate]]:
        for kind, name, limits in self._named(job):
            of = _KINDS[kind]
            if limits.rate is not None:
                yield f"{of}.rate", rate_key(of, name), limits.rate
            if limits.rate_per_key is not None and job.limit_key:
                yield f"{of}.rate_per_key", rate_key(of, name, job.limit_key), limits.rate_per_key

    def load(self, connection: BaseDatabaseWrapper, jobs: Iterable[Job]) -> None:
        """Read the rate rows of ``jobs``' keys not read yet (one statement)."""
        wanted = {
            key: rate
            for job in jobs
            for _rule, key, rate in self._rated(job)
            if key not in self.rates
        }
        self.rates.update(read_states(connection, wanted))

    def refusal(self, job: Job) -> str | None:
        """The first rule with no room for ``job`` (None: every one admits it)."""
        for rule, counted, limit in self._counted(job):
            if self.running[counted] >= limit:
                return rule
        for rule, rated, rate in self._rated(job):
            if self.rates[rated].room(self.now) < units_of(job.cost, rate):
                return rule
        return None

    def take(self, job: Job) -> None:
        """Count ``job`` as started."""
        for _rule, counted, _limit in self._counted(job):
            self.running[counted] += 1
        for _rule, rated, rate in self._rated(job):
            self.rates[rated].take(units_of(job.cost, rate), self.now)

    def room_for(self, count: int) -> bool:
        """Whether ``count`` more starts of any jobs keep every limit — each counter
        gains at most ``count``, each rate at most ``count`` full bursts: then the
        claim need not pick (the plain claim's choice, in the same transaction, keeps
        them all). Never with a per-key rate, whose keys are not known before the
        candidates are."""
        for kind, name, limits in _each(self.limits):
            if limits.rate_per_key is not None:
                return False
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
            if limits.rate is not None:
                state = self.rates[rate_key(_KINDS[kind], name)]
                if state.room(self.now) < count * limits.rate.capacity:
                    return False
        return True

    def full(self) -> dict[str, list[Any]]:
        """What is at a limit: handlers, queues, (name, scope) and (name, key) pairs —
        the candidates' exclusions (see :func:`jobs.store.sql_limits.candidates`)."""
        out: dict[str, list[Any]] = {
            prefix: [] for prefix in ("fh", "fq", "fhs", "fqs", "fhk", "fqk")
        }
        for kind, name, limits in _each(self.limits):
            of = _KINDS[kind]
            at_max = (
                limits.max_running is not None and self.running[(kind, name)] >= limits.max_running
            )
            at_rate = limits.rate is not None and self.rates[rate_key(of, name)].room(self.now) < 1
            if at_max or at_rate:
                out[f"f{kind}"].append(name)
            for suffix, limit in (
                ("s", limits.max_running_per_scope),
                ("k", limits.max_running_per_key),
            ):
                if limit is None:
                    continue
                out[f"f{kind}{suffix}"].extend(
                    (key[1], key[2])
                    for key, count in self.running.items()
                    if key[0] == kind + suffix and key[1] == name and count >= limit
                )
            if limits.rate_per_key is not None:
                prefix = rate_key(of, name) + "#"
                out[f"f{kind}k"].extend(
                    (name, key[len(prefix) :])
                    for key, state in self.rates.items()
                    if key.startswith(prefix) and state.room(self.now) < 1
                )
        return out

    def held(self, jobs: Iterable[Job], chosen: set[int]) -> list[Held]:
        """The jobs of ``jobs`` (the first due) not ``chosen`` that a rule holds back,
        by queue, handler and rule."""
        counts: Counter[tuple[str, str, str]] = Counter()
        for job in jobs:
            if job.id not in chosen and (rule := self.refusal(job)) is not None:
                counts[(job.queue, job.handler, rule)] += 1
        return [
            Held(queue, handler, rule, n) for (queue, handler, rule), n in sorted(counts.items())
        ]


def read_usage(connection: BaseDatabaseWrapper, limits: ClaimLimits, now: datetime) -> Usage:
    """SQLite: the Running jobs the counted limits of ``limits`` count (one statement),
    and the rows of the handlers' and queues' own rates (one more)."""
    usage = Usage(limits, nanoseconds(now))
    counted = [(kind, name) for kind, name, value in _each(limits) if value.counted]
    if counted:
        handlers = [name for kind, name in counted if kind == "h"]
        queues = [name for kind, name in counted if kind == "q"]
        params = {**in_list_params("lim_handler", handlers), **in_list_params("lim_queue", queues)}
        for row in fetch(connection, sql_limits.usage(len(handlers), len(queues)), params):
            for kind, name, configured in (
                ("h", row["handler"], limits.handlers),
                ("q", row["queue"], limits.queues),
            ):
                if name in configured and configured[name].counted:
                    usage.running[(kind, name)] += row["n"]
                    usage.running[(kind + "s", name, row["scope_hash"])] += row["n"]
                    if row["limit_key"]:
                        usage.running[(kind + "k", name, row["limit_key"])] += row["n"]
    own = {
        rate_key(_KINDS[kind], name): value.rate
        for kind, name, value in _each(limits)
        if value.rate is not None
    }
    usage.rates.update(read_states(connection, own))
    return usage


def _candidates(
    connection: BaseDatabaseWrapper,
    base_params: dict[str, Any],
    *,
    limit: int,
    queues: int,
    one_job: bool,
    full: dict[str, list[Any]] | None = None,
    seen: set[int] = frozenset(),  # type: ignore[assignment]
) -> list[Job]:
    """SQLite: up to ``limit`` due jobs in claim order, leaving out what ``full`` says
    is at a limit and the ``seen`` ones."""
    full = full or {}
    params: dict[str, Any] = {**base_params, "limit": limit}
    params.update(in_list_params("fh", full.get("fh", [])))
    params.update(in_list_params("fq", full.get("fq", [])))
    params.update(in_list_params("seen", sorted(seen)))
    for prefix in ("fhs", "fqs", "fhk", "fqk"):
        for n, (name, scope) in enumerate(full.get(prefix, [])):
            params[f"{prefix}_k_{n}"] = name
            params[f"{prefix}_s_{n}"] = scope
    statement = sql_limits.candidates(
        queues=queues,
        one_job=one_job,
        full_handlers=len(full.get("fh", [])),
        full_queues=len(full.get("fq", [])),
        full_handler_scopes=len(full.get("fhs", [])),
        full_queue_scopes=len(full.get("fqs", [])),
        full_handler_keys=len(full.get("fhk", [])),
        full_queue_keys=len(full.get("fqk", [])),
        seen=len(seen),
    )
    return [Job(**row) for row in fetch(connection, statement, params)]


def choose(
    connection: BaseDatabaseWrapper,
    usage: Usage,
    *,
    limit: int,
    base_params: dict[str, Any],
    queues: int,
    one_job: bool,
) -> tuple[list[int], list[Held]]:
    """Pick up to ``limit`` due jobs that keep every limit (see the module's
    docstring); returns their ids, in claim order, and the jobs the limits held back
    among the first ``limit`` due (what a claim without limits would have taken).

    Each page asks for as many jobs as are still wanted; a job skipped means a key
    had no room for it, which the next page leaves out (or the job, once seen) — so
    the pages end.
    """
    shape = {"base_params": base_params, "queues": queues, "one_job": one_job}
    chosen: list[int] = []
    seen: set[int] = set()
    bound = False
    while len(chosen) < limit:
        wanted = limit - len(chosen)
        full = usage.full()
        bound = bound or any(full.values())
        rows = _candidates(connection, limit=wanted, full=full, seen=seen, **shape)  # type: ignore[arg-type]
        usage.load(connection, rows)
        skipped = False
        for job in rows:
            seen.add(job.id)
            if usage.refusal(job) is None:
                usage.take(job)
                chosen.append(job.id)
            else:
                skipped = True
        bound = bound or skipped
        if len(rows) < wanted or not skipped:
            break
    if not bound:
        return chosen, []
    first = _candidates(connection, limit=limit, **shape)  # type: ignore[arg-type]
    usage.load(connection, first)
    return chosen, usage.held(first, set(chosen))
