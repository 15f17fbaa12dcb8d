"""Rates as rows (``jobs_ratebucket``), in Python: the rule a rate's row keeps, as
SQLite's claims apply it under their write lock (PostgreSQL's apply it in the claim's
statement, :mod:`jobs.store.sql_limits`), what operators read of it, and the pruning
of rows that hold nothing.

A token bucket (a rate with a burst) is kept as GCRA: ``tat``, the theoretical arrival
time of the next unit, moves ``units × T`` past the later of itself and now with each
start (``T = seconds / count``); a start fits while ``max(tat, now) + units × T <= now
+ burst × T``. A key never used, or quiet for ``burst × T``, has its whole burst. A
sliding window keeps the units started in it by start time; a start fits while the
window holds at most ``count`` units with it. Times are nanoseconds since the epoch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..db import fetch, in_list_params, numbered
from ..flow_control import Rate
from . import sql_limits

#: Rows that hold nothing are pruned this long after: a margin for claimers whose
#: clocks run behind.
PRUNE_MARGIN = timedelta(minutes=5)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def nanoseconds(moment: datetime) -> int:
    """``moment`` (aware) in nanoseconds since the epoch, exactly."""
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def moment(ns: int) -> datetime:
    """Nanoseconds since the epoch as an aware datetime (to the microsecond, rounded
    up: a time a rate frees is never shown early)."""
    return _EPOCH + timedelta(microseconds=-(-ns // 1000))


def rate_key(kind: str, name: str, limit_key: str = "") -> str:
    """The rate row of a handler's or a queue's rate (``kind``: ``handler`` or
    ``queue``), or with ``limit_key`` of that key's ``rate_per_key``."""
    return f"{kind}:{name}#{limit_key}" if limit_key else f"{kind}:{name}"


def units_of(cost: int, rate: Rate) -> int:
    """The units a job of ``cost`` counts under ``rate``: its cost, at most the rate's
    capacity (a larger cost is refused at submit; a job submitted before the rate was
    declared counts as a full burst)."""
    return min(cost, rate.capacity)


def _stamps(value: Any) -> list[tuple[int, int]]:
    """A row's ``stamps`` as read (JSON text on SQLite, parsed on PostgreSQL)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = json.loads(value)
    return [(int(t), int(n)) for t, n in value]


@dataclass(slots=True)
class RateState:
    """One rate's row as read, kept current as a claim picks jobs under it."""

    key: str
    rate: Rate
    tat: int | None = None
    stamps: list[tuple[int, int]] = field(default_factory=list)
    touched: bool = False

    @classmethod
    def of(cls, key: str, rate: Rate, row: Mapping[str, Any] | None) -> RateState:
        if row is None:
            return cls(key, rate)
        return cls(key, rate, row["tat"], _stamps(row["stamps"]))

    def _kept(self, now: int, *, grace: bool = False) -> list[tuple[int, int]]:
        """The window's starts at ``now`` — with ``grace``, those a claimer whose clock
        is behind by less than an eighth of the window still counts."""
        span = self.rate.span_ns()
        since = now - span - (span // 8 if grace else 0)
        return [(t, n) for t, n in self.stamps if t > since]

    def room(self, now: int) -> int:
        """The units that may start at ``now``."""
        rate = self.rate
        if rate.burst is not None:
            interval = rate.interval_ns()
            ahead = max(self.tat or now, now)
            return (now + rate.burst * interval - ahead) // interval
        return rate.count - sum(n for _t, n in self._kept(now))

    def take(self, units: int, now: int) -> None:
        """Count ``units`` started at ``now``."""
        self.touched = True
        rate = self.rate
        if rate.burst is not None:
            self.tat = max(self.tat or now, now) + units * rate.interval_ns()
            return
        grain = rate.quantum_ns()
        stamp = -(-now // grain) * grain
        counts: dict[int, int] = {}
        for t, n in [*self._kept(now, grace=True), (stamp, units)]:
            counts[t] = counts.get(t, 0) + n
        self.stamps = sorted(counts.items())

    def frees_at(self, now: int, units: int = 1) -> int:
        """When ``units`` more may start (``now`` if they may now)."""
        rate = self.rate
        if rate.burst is not None:
            interval = rate.interval_ns()
            return max(now, max(self.tat or now, now) + (units - rate.burst) * interval)
        kept = sorted(self._kept(now))
        excess = sum(n for _t, n in kept) + units - rate.count
        for t, n in kept:
            if excess <= 0:
                break
            excess -= n
            now = max(now, t + rate.span_ns())
        return now

    def row(self, now: int) -> dict[str, Any]:
        """The row's columns after the claim at ``now`` (see
        :data:`jobs.store.sql_limits.RATE_COLUMNS`)."""
        rate = self.rate
        if rate.burst is not None:
            assert self.tat is not None
            horizon = now + rate.burst * rate.interval_ns()
            return dict(
                key=self.key, tat=self.tat, horizon=horizon, stamps=None, used=None, cap=None,
                window_start=None, ends=self.tat,
            )  # fmt: skip
        kept = self._kept(now, grace=True)
        span = rate.span_ns()
        return dict(
            key=self.key, tat=None, horizon=now - span - span // 8, stamps=json.dumps(kept),
            used=sum(n for _t, n in self._kept(now)), cap=rate.count, window_start=now - span,
            ends=max((t for t, _n in kept), default=now) + span,
        )  # fmt: skip


def read_states(connection: BaseDatabaseWrapper, rates: Mapping[str, Rate]) -> dict[str, RateState]:
    """The states of the rate keys of ``rates`` (key -> its rate), one statement."""
    if not rates:
        return {}
    keys = sorted(rates)
    rows = {
        row["key"]: row
        for row in fetch(connection, sql_limits.read_rates(len(keys)), in_list_params("key", keys))
    }
    return {key: RateState.of(key, rates[key], rows.get(key)) for key in keys}


def write_states(connection: BaseDatabaseWrapper, states: Iterable[RateState], now: int) -> None:
    """SQLite: write the rows of ``states`` a claim counted starts in (its
    transaction read them)."""
    rows = [state.row(now) for state in states if state.touched]
    if rows:
        fetch(connection, sql_limits.write_rates(len(rows)), numbered(rows))


def prune(connection: BaseDatabaseWrapper, now: datetime) -> int:
    """Delete the rate rows that have held nothing for :data:`PRUNE_MARGIN` (no row
    is the same as a full bucket or an empty window); returns how many."""
    before = nanoseconds(now - PRUNE_MARGIN)
    with connection.cursor() as cursor:
        cursor.execute(sql_limits.PRUNE_RATES, {"before": before})
        return max(int(cursor.rowcount), 0)


def states_of(connection: BaseDatabaseWrapper, keys: Sequence[tuple[str, Rate]]) -> list[RateState]:
    """The states of ``keys`` (rate key, its rate), in that order: for operators'
    tools."""
    found = read_states(connection, dict(keys))
    return [found[key] for key, _rate in keys]
