"""Flow control: the limits of a handler or a queue, and which of them apply to
a claim. Enforced by the claim itself (:mod:`jobs.store.limits`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .exceptions import InvalidLimits

#: A rate without a burst keeps the start times of its window one by one up to this
#: many starts; above it, rounded up to ``seconds / EXACT_STAMPS`` (see :class:`Rate`).
EXACT_STAMPS = 64
#: Nanoseconds in a second: rates keep their times as integers of nanoseconds.
NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` units of cost started per ``seconds`` (in (0, 86400]).

    Without ``burst``, a sliding window: no window of ``seconds`` ever holds more than
    ``count`` units. With ``burst`` (a positive int), a token bucket: up to ``burst``
    units start at once after a quiet spell, and any window of ``W`` seconds holds at
    most ``burst + W * count / seconds`` units.
    """

    count: int
    seconds: float
    burst: int | None = None

    @classmethod
    def of(cls, value: object, name: str) -> Rate:
        """``value`` — a Rate, or ``(count, seconds)`` or ``(count, seconds, burst)`` —
        checked; :class:`~jobs.exceptions.InvalidLimits` naming ``name`` if it is not
        valid."""
        if isinstance(value, Rate):
            return value
        if not isinstance(value, tuple | list) or len(value) not in (2, 3):
            raise InvalidLimits(
                f"{name} must be (count, seconds) or (count, seconds, burst), got {value!r}"
            )
        count, seconds = value[0], value[1]
        burst = value[2] if len(value) == 3 else None
        if not _positive_int(count):
            raise InvalidLimits(f"{name}'s count must be a positive int, got {count!r}")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 < seconds <= 86_400
        ):
            raise InvalidLimits(f"{name}'s seconds must be a number in (0, 86400], got {seconds!r}")
        if burst is not None and not _positive_int(burst):
            raise InvalidLimits(f"{name}'s burst must be a positive int, got {burst!r}")
        rate = cls(count, float(seconds), burst)
        if rate.interval_ns() > 86_400 * NS:
            raise InvalidLimits(f"{name}: one unit per {seconds / count:g} s is too slow")
        return rate

    @property
    def capacity(self) -> int:
        """The most units that may start at once: the burst, else the count. A job's
        cost above it is refused at submit."""
        return self.count if self.burst is None else self.burst

    def interval_ns(self) -> int:
        """A token bucket's interval between two units, in nanoseconds, rounded up
        (so the bucket never admits faster than the rate)."""
        return max(math.ceil(self.seconds * NS / self.count), 1)

    def span_ns(self) -> int:
        """The window's length, in nanoseconds."""
        return round(self.seconds * NS)

    def quantum_ns(self) -> int:
        """A window's grain: start times are kept rounded up to it — 1 ns (exact)
        up to :data:`EXACT_STAMPS` units per window, ``seconds / EXACT_STAMPS``
        above, so that a window's row keeps at most that many times."""
        if self.count <= EXACT_STAMPS:
            return 1
        return math.ceil(self.span_ns() / EXACT_STAMPS)

    def describe(self) -> str:
        """``10/1s`` or ``10/1s burst 20``."""
        text = f"{self.count}/{self.seconds:g}s"
        return text if self.burst is None else f"{text} burst {self.burst}"


def _positive_int(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Flow control for one handler or one queue, across every worker.

    ``max_running``: Running attempts at once; ``max_running_per_scope``: the same
    per scope; ``max_running_per_key``: the same per limit key (a submission's
    ``limit_key``; jobs without one are not counted), across scopes; ``rate``:
    ``(count, seconds)`` or ``(count, seconds, burst)`` (a :class:`Rate`) of the
    units of cost started; ``rate_per_key``: the same per limit key.
    """

    max_running: int | None = None
    max_running_per_scope: int | None = None
    max_running_per_key: int | None = None
    rate: Rate | None = None
    rate_per_key: Rate | None = None

    def __post_init__(self) -> None:
        for name in ("max_running", "max_running_per_scope", "max_running_per_key"):
            value = getattr(self, name)
            if value is not None and not _positive_int(value):
                raise InvalidLimits(f"{name} must be a positive int or None, got {value!r}")
        for name in ("rate", "rate_per_key"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Rate.of(value, name))

    def __bool__(self) -> bool:
        return any(
            value is not None
            for value in (
                self.max_running,
                self.max_running_per_scope,
                self.max_running_per_key,
                self.rate,
                self.rate_per_key,
            )
        )

    @property
    def counted(self) -> bool:
        """Whether a limit counts Running jobs (``max_running`` and the like)."""
        return (
            self.max_running is not None
            or self.max_running_per_scope is not None
            or self.max_running_per_key is not None
        )

    def describe(self) -> str:
        """``max_running=2, rate=10/1s`` (or ``none``), for operators' tools."""
        parts = []
        if self.max_running is not None:
            parts.append(f"max_running={self.max_running}")
        if self.max_running_per_scope is not None:
            parts.append(f"max_running_per_scope={self.max_running_per_scope}")
        if self.max_running_per_key is not None:
            parts.append(f"max_running_per_key={self.max_running_per_key}")
        if self.rate is not None:
            parts.append(f"rate={self.rate.describe()}")
        if self.rate_per_key is not None:
            parts.append(f"rate_per_key={self.rate_per_key.describe()}")
        return ", ".join(parts) or "none"


#: The keys of :class:`Limits`, as ``@job_handler`` and ``JOBS["QUEUES"]`` take them.
LIMIT_NAMES = (
    "max_running",
    "max_running_per_scope",
    "max_running_per_key",
    "rate",
    "rate_per_key",
)


def limits_of(values: Mapping[str, Any]) -> Limits:
    """The :class:`Limits` among ``values`` (other keys ignored)."""
    return Limits(**{key: value for key, value in values.items() if key in LIMIT_NAMES})


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """The limits a claim must respect: per handler name (every version) and per
    queue. Falsy when none applies: the claim is then the plain one."""

    handlers: Mapping[str, Limits] = field(default_factory=dict)
    queues: Mapping[str, Limits] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.handlers or self.queues)

    def for_queues(self, queues: Sequence[str]) -> ClaimLimits:
        """Only the queue limits of ``queues`` (a claim of every queue: all)."""
        if not queues or not self.queues:
            return self
        return ClaimLimits(self.handlers, {q: self.queues[q] for q in queues if q in self.queues})

    def over_capacity(self, handler: str, queue: str, limit_key: str, cost: int) -> str | None:
        """The first rate a job of ``handler`` in ``queue`` with ``limit_key`` falls
        under whose capacity is below ``cost``, described (None: every one admits
        it)."""
        for kind, name, limits in (
            ("handler", handler, self.handlers.get(handler)),
            ("queue", queue, self.queues.get(queue)),
        ):
            if limits is None:
                continue
            for what, rate in (("rate", limits.rate), ("rate_per_key", limits.rate_per_key)):
                if rate is None or (what == "rate_per_key" and not limit_key):
                    continue
                if cost > rate.capacity:
                    return f"{kind} {name!r} {what}={rate.describe()} (capacity {rate.capacity})"
        return None


NO_LIMITS = ClaimLimits()


#: The limits of the registered handler names, kept by the handlers' registry
#: (:mod:`jobs.handlers`) and read by the store (a job's cost is checked against its
#: rates at submit).
_handler_limits: Mapping[str, Limits] = {}


def declared_handler_limits() -> Mapping[str, Limits]:
    """The limits of every registered handler name that has any."""
    return _handler_limits


def set_handler_limits(limits: Mapping[str, Limits]) -> None:
    """The registry's limits by handler name (called under its lock)."""
    global _handler_limits
    _handler_limits = limits


#: The handler names whose Failed jobs halt their sequence
#: (``@job_handler(sequence_halts_on_failure=True)``), kept by the registry
#: (:mod:`jobs.handlers`) and read by the store when a job of a sequence ends.
_halting: frozenset[str] = frozenset()


def halting_handlers() -> frozenset[str]:
    """The registered handler names whose Failed jobs halt their sequence."""
    return _halting


def set_halting_handlers(names: frozenset[str]) -> None:
    """The registry's names that halt sequences (called under its lock)."""
    global _halting
    _halting = names
