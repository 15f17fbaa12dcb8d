"""The rules of who goes next that a submission carries beside its identity: a start
deadline (and, as they come, limit keys, uniqueness and debounce). They are checked
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


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRules:
    """``start_by`` (an aware datetime, in UTC) or ``start_within`` (seconds after the
    submit): a job not started by then never starts and ends Expired."""

    start_by: datetime | None = None
    start_within: float | None = None

    def deadline(self, now: datetime) -> datetime | None:
        """The job's start deadline if it is submitted at ``now``."""
        if self.start_within is not None:
            return now + timedelta(seconds=self.start_within)
        return self.start_by


#: A submission without rules (the default: every rule off).
NO_RULES = SubmitRules()


def submit_rules(*, start_by: object = None, start_within: object = None) -> SubmitRules:
    """The rules of a submission, checked: each a typed error (``InvalidSubmission``)
    if it is not valid, or if it contradicts another."""
    if start_by is None and start_within is None:
        return NO_RULES
    if start_by is not None and start_within is not None:
        raise InvalidSubmission("give start_by or start_within, not both")
    within: float | None = None
    if start_within is not None:
        if (
            isinstance(start_within, bool)
            or not isinstance(start_within, int | float)
            or not math.isfinite(start_within)
            or not 0 < start_within <= MAX_START_WITHIN
        ):
            raise InvalidSubmission(
                f"start_within must be a number of seconds in (0, {MAX_START_WITHIN}],"
                f" got {start_within!r}"
            )
        within = float(start_within)
    return SubmitRules(
        start_by=validation.optional_aware_utc(start_by, "start_by"), start_within=within
    )
