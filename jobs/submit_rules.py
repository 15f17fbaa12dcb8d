"""The rules of who goes next that a submission carries beside its identity: a start
deadline, a limit key, uniqueness and debounce. They are checked
when the submission is created and applied by the submit statement; they are not part
of the identity, so submitting the same job again returns it whatever they say."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from . import validation
from .exceptions import InvalidSubmission

#: The longest ``start_within``: ten years, in seconds.
MAX_START_WITHIN = 10 * 365 * 86_400


#: While a job with its ``unique_key`` is Queued, or Queued or Running.
UNIQUE_WHILE = ("queued", "active")
#: ``unique_while`` as stored for a key held ``unique_for`` seconds instead.
UNIQUE_FOR = "for"


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRules:
    """``start_by`` (an aware datetime, in UTC) or ``start_within`` (seconds after the
    submit): a job not started by then never starts and ends Expired.

    ``limit_key``: the key the handler's and queue's ``max_running_per_key`` count it
    under, across scopes.

    ``unique_key`` (counted within the scope) with ``unique_while`` ("queued" or
    "active") or ``unique_for`` (seconds): while a job of the scope holds the key, a
    submission with it returns that job. ``debounce`` (seconds): the job is due that
    long after the latest submission of a burst, whose payload it takes, never later
    than ``debounce_max`` seconds after the burst's first.

    ``sequence_key`` (counted within the scope): the scope's jobs with that key start
    one at a time, in submission order."""

    start_by: datetime | None = None
    start_within: float | None = None
    limit_key: str | None = None
    unique_key: str | None = None
    unique_while: str | None = None
    unique_for: float | None = None
    debounce: float | None = None
    debounce_max: float | None = None
    sequence_key: str | None = None

    @property
    def unique_mode(self) -> str:
        """How the key is held, as stored in ``jobs_job.unique_while`` ("" without a
        key)."""
        if self.unique_key is None:
            return ""
        if self.unique_for is not None:
            return UNIQUE_FOR
        return self.unique_while or "queued"

    def deadline(self, now: datetime) -> datetime | None:
        """The job's start deadline if it is submitted at ``now``."""
        if self.start_within is not None:
            return now + timedelta(seconds=self.start_within)
        return self.start_by


#: A submission without rules (the default: every rule off).
NO_RULES = SubmitRules()


def _seconds(value: object, what: str) -> float | None:
    """``value`` as seconds in (0, ten years], or None; ``InvalidSubmission`` else."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_START_WITHIN
    ):
        raise InvalidSubmission(
            f"{what} must be a number of seconds in (0, {MAX_START_WITHIN}], got {value!r}"
        )
    return float(value)


def submit_rules(
    *,
    start_by: object = None,
    start_within: object = None,
    limit_key: object = None,
    unique_key: object = None,
    unique_while: object = None,
    unique_for: object = None,
    debounce: object = None,
    debounce_max: object = None,
    not_before: object = None,
    sequence_key: object = None,
) -> SubmitRules:
    """The rules of a submission, checked: each a typed error (``InvalidSubmission``)
    if it is not valid, or if it contradicts another."""
    if start_by is not None and start_within is not None:
        raise InvalidSubmission("give start_by or start_within, not both")
    key = None if unique_key is None else validation.key(unique_key, "unique_key")
    if key is None:
        for name, value in (
            ("unique_while", unique_while),
            ("unique_for", unique_for),
            ("debounce", debounce),
        ):
            if value is not None:
                raise InvalidSubmission(f"{name} needs a unique_key")
    if unique_while is not None and unique_while not in UNIQUE_WHILE:
        raise InvalidSubmission(f"unique_while must be 'queued' or 'active', got {unique_while!r}")
    if unique_for is not None and unique_while is not None:
        raise InvalidSubmission("give unique_while or unique_for, not both")
    if debounce_max is not None and debounce is None:
        raise InvalidSubmission("debounce_max needs a debounce")
    if debounce is not None and (unique_for is not None or unique_while == "active"):
        raise InvalidSubmission(
            "a debounced job is replaced while it is queued: debounce goes with"
            " unique_while='queued' only"
        )
    if debounce is not None and not_before is not None:
        raise InvalidSubmission(
            "a debounced job is due debounce seconds after its submit: no not_before"
        )
    rules = SubmitRules(
        start_by=validation.optional_aware_utc(start_by, "start_by"),
        start_within=_seconds(start_within, "start_within"),
        limit_key=None if limit_key is None else validation.key(limit_key, "limit_key"),
        unique_key=key,
        unique_while=unique_while if isinstance(unique_while, str) else None,
        unique_for=_seconds(unique_for, "unique_for"),
        debounce=_seconds(debounce, "debounce"),
        debounce_max=_seconds(debounce_max, "debounce_max"),
        sequence_key=None if sequence_key is None else validation.key(sequence_key, "sequence_key"),
    )
    return NO_RULES if rules == NO_RULES else rules
