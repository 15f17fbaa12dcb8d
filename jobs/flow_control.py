"""Flow control: the limits of a handler or a queue, and which of them apply to
a claim. Enforced by the claim itself (:mod:`jobs.store.limits`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .exceptions import InvalidLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Flow control for one handler or one queue, across every worker.

    ``max_running``: Running attempts at once; ``max_running_per_scope``: the same
    per scope; ``max_running_per_key``: the same per limit key (a submission's
    ``limit_key``; jobs without one are not counted), across scopes; ``rate``:
    ``(count, seconds)``, at most ``count`` attempt starts in any window of ``seconds``
    (a sliding window over the claims' start times).
    """

    max_running: int | None = None
    max_running_per_scope: int | None = None
    max_running_per_key: int | None = None
    rate: tuple[int, float] | None = None

    def __post_init__(self) -> None:
        for name in ("max_running", "max_running_per_scope", "max_running_per_key"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise InvalidLimits(f"{name} must be a positive int or None, got {value!r}")
        rate = self.rate
        if rate is not None:
            if not isinstance(rate, tuple | list) or len(rate) != 2:
                raise InvalidLimits(f"rate must be a (count, seconds) pair, got {rate!r}")
            count, seconds = rate
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise InvalidLimits(f"rate's count must be a positive int, got {count!r}")
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, int | float)
                or not 0 < seconds <= 86_400
            ):
                raise InvalidLimits(
                    f"rate's seconds must be a number in (0, 86400], got {seconds!r}"
                )
            object.__setattr__(self, "rate", (count, float(seconds)))

    def __bool__(self) -> bool:
        return any(
            value is not None
            for value in (
                self.max_running,
                self.max_running_per_scope,
                self.max_running_per_key,
                self.rate,
            )
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
            parts.append(f"rate={self.rate[0]}/{self.rate[1]:g}s")
        return ", ".join(parts) or "none"


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


NO_LIMITS = ClaimLimits()


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
