"""Exponential back-off: one formula, two uses.

:func:`exponential` is the formula, ``base * factor ** n`` capped at ``cap``.

- :func:`retry_delay` paces the automatic retries of failed work — a job's attempt
  (``jobs.handlers.RetryPolicy``), an outbox message's delivery, a consumed message's
  handling, a saga step's compensation — each app with its own settings: the delay
  after failed attempt ``n`` is the formula at ``n - 1``, spread by ``± jitter``.
- One :class:`Backoff` per engine paces every retry of a failed database step: the
  first retry comes quickly (a lost connection is usually back at once), later ones
  spread out up to ``cap`` seconds, so that an outage costs each engine one attempt
  every few seconds instead of hundreds a second. Jitter keeps many engines that
  lost the database together from reconnecting in lock-step; it only shortens a
  delay, so that :attr:`Backoff.ceiling` is what "retrying every …" may say.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Protocol


def exponential(n: int, *, base: float, factor: float, cap: float) -> float:
    """``base * factor ** n``, at most ``cap``."""
    # min() before the power would overflow: the cap is reached long before.
    return min(cap, base * factor ** min(n, 64))


def retry_delay(
    attempt: int,
    *,
    base: float,
    factor: float,
    cap: float,
    jitter: float,
    rng: random.Random | None = None,
) -> float:
    """Seconds before the retry that follows failed attempt number ``attempt``
    (1-based): ``base * factor ** (attempt - 1)``, capped at ``cap``, then spread by
    ``± jitter`` (a ratio). Never negative."""
    raw = exponential(max(attempt - 1, 0), base=base, factor=factor, cap=cap)
    if not jitter:
        return raw
    return max(0.0, raw * (1 + (rng or random).uniform(-jitter, jitter)))


class RetrySettings(Protocol):
    """An app's settings with the four keys of its automatic retries."""

    @property
    def RETRY_BASE_DELAY(self) -> float: ...
    @property
    def RETRY_BACKOFF_FACTOR(self) -> float: ...
    @property
    def RETRY_MAX_DELAY(self) -> float: ...
    @property
    def RETRY_JITTER(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RetryPace:
    """The pace of automatic retries: :func:`retry_delay` with these four numbers."""

    base: float
    factor: float
    cap: float
    jitter: float

    @classmethod
    def from_settings(cls, settings: RetrySettings) -> RetryPace:
        """The pace an app's ``RETRY_*`` settings (``JOBS``, ``OUTBOX``) give."""
        return cls(
            settings.RETRY_BASE_DELAY,
            settings.RETRY_BACKOFF_FACTOR,
            settings.RETRY_MAX_DELAY,
            settings.RETRY_JITTER,
        )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds before the retry that follows failed attempt number ``attempt``."""
        return retry_delay(
            attempt, base=self.base, factor=self.factor, cap=self.cap, jitter=self.jitter, rng=rng
        )


#: The defaults of every engine: 0.1 s, 0.2 s, 0.4 s … at most 2 s between attempts.
BASE_DELAY = 0.1
FACTOR = 2.0
CAP = 2.0
JITTER = 0.5


class Backoff:
    """Delays before successive retries: ``base * factor ** n`` capped at ``cap``, each
    drawn from ``[delay * (1 - jitter), delay]``. Thread-safe; :meth:`reset` after a
    success starts again from ``base``."""

    def __init__(
        self,
        *,
        base: float = BASE_DELAY,
        factor: float = FACTOR,
        cap: float = CAP,
        jitter: float = JITTER,
        rng: random.Random | None = None,
    ) -> None:
        if base <= 0 or factor < 1 or cap < base:
            raise ValueError("a back-off needs base > 0, factor >= 1 and cap >= base")
        if not 0 <= jitter < 1:
            raise ValueError("back-off jitter must be in [0, 1)")
        self.base = base
        self.factor = factor
        self.cap = cap
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._failures = 0

    @property
    def failures(self) -> int:
        """Delays handed out since the last reset."""
        return self._failures

    @property
    def ceiling(self) -> float:
        """The longest delay the next retry may get (what "retrying every …" says)."""
        with self._lock:
            return self._raw(self._failures)

    def next_delay(self) -> float:
        """Seconds to wait before the next retry; each call counts one failure."""
        with self._lock:
            raw = self._raw(self._failures)
            self._failures += 1
            return raw * (1 - self.jitter * self._rng.random())

    def reset(self) -> None:
        with self._lock:
            self._failures = 0

    def _raw(self, failures: int) -> float:
        return exponential(failures, base=self.base, factor=self.factor, cap=self.cap)
