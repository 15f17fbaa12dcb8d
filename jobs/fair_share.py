"""Fair share across scopes: a job's place in its queue's line, in microseconds of
virtual time (``Job.fair_at``). The claim takes due jobs by priority, then place.

In a fair queue (the default; ``JOBS["QUEUES"][name]["fair"] = False`` keeps
submission order) a job due when it is submitted is placed by its scope's lane
(``jobs_lane``): one :data:`QUANTUM` over the scope's weight after the later of the
lane's tail and the head of the line — so every scope with work holds places in
proportion to its weight, and a scope that arrives while another holds a backlog
starts next to the head. A job due later, and a job in a queue that is not fair, is
placed at its due time (:func:`place`). See ``docs/flow-control.md``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from .exceptions import InvalidWeight

#: Virtual time between two jobs of one scope at weight 1, in microseconds.
QUANTUM = 1000
#: The largest weight; the smallest is anything above zero.
MAX_WEIGHT = 100.0

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def place(moment: datetime) -> int:
    """The place in line of a job due at ``moment`` (an aware datetime) that no lane
    places: its microseconds since the epoch."""
    return (moment - _EPOCH) // _MICROSECOND


def check_weight(weight: object) -> float:
    """``weight`` as a float, if it is a number in (0, :data:`MAX_WEIGHT`]; else
    :class:`~jobs.exceptions.InvalidWeight`."""
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or not 0 < weight <= MAX_WEIGHT
    ):
        raise InvalidWeight(f"a scope's weight must be a number in (0, 100], got {weight!r}")
    return float(weight)
