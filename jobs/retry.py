"""The automatic retry policy of job handlers and the failure that skips it.

Its own module so that :mod:`jobs.context` can name the policy without importing the
handler registry (which imports the context). Both names are public in
:mod:`jobs.handlers` too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from ledon.backoff import RetryPace

from .conf import jobs_settings
from .exceptions import JobCancelled, JobsConfigurationError


class PermanentFailure(Exception):
    """Raise from a handler to fail the job without any automatic retry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with jitter for automatic retries, which the worker makes
    through ``retry``.

    The delay before attempt ``n + 1`` is ``base_delay * factor ** (n - 1)``, capped at
    ``max_delay``, then spread by ``± jitter`` (a ratio). Retries never go beyond the
    job's ``max_attempts``; ``retry_on`` limits which exceptions are retried.
    """

    base_delay: float = 2.0
    factor: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.25
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.base_delay < 0 or self.factor < 1 or self.max_delay < 0:
            raise JobsConfigurationError(
                "retry policy needs base_delay >= 0, factor >= 1 and max_delay >= 0"
            )
        if not 0 <= self.jitter < 1:
            raise JobsConfigurationError("retry policy jitter must be in [0, 1)")

    @classmethod
    def from_settings(cls) -> RetryPolicy:
        pace = RetryPace.from_settings(jobs_settings())
        return cls(base_delay=pace.base, factor=pace.factor, max_delay=pace.cap, jitter=pace.jitter)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        pace = RetryPace(self.base_delay, self.factor, self.max_delay, self.jitter)
        return pace.delay(attempt, rng)

    def retry_at(self, attempt: int, now: datetime, exc: BaseException) -> datetime | None:
        """When to run again after ``exc`` ended ``attempt``, or None for no retry."""
        if isinstance(exc, PermanentFailure | JobCancelled) or not isinstance(exc, self.retry_on):
            return None
        return now + timedelta(seconds=self.delay(attempt))
