"""Run deadlines: the wake-up staged with a run that has one, and what a run whose
deadline passed says (:func:`~workflows.store.time_out` ends it, in :mod:`.control`).

The wake-up is an advance job of the run, due at its deadline, staged in the
transaction that creates the run (and again with a resume): durable like the run,
and dropped with the run's other wake-ups when it finishes first.
"""

from __future__ import annotations

from datetime import datetime

from ..exceptions import RunTimedOut
from .waking import wake

#: The reason of a deadline's advance job (``wf:{run}.{generation}:deadline``).
DEADLINE = "deadline"


def stage_deadline(run_pk: int, generation: int, deadline: datetime | None, now: datetime) -> None:
    """Stage the advance job that wakes run ``run_pk`` at its ``deadline`` (if it has
    one), inside the caller's transaction."""
    if deadline is not None:
        wake(run_pk, generation, DEADLINE, not_before=deadline, now=now)


def deadline_passed(deadline: datetime | None, now: datetime) -> bool:
    """Whether a run with ``deadline`` has timed out at ``now``."""
    return deadline is not None and now >= deadline


def timed_out_error(run_id: str, deadline: datetime) -> str:
    """What a timed-out run's ``error`` says: the error's type name and message."""
    error = RunTimedOut(f"run {run_id!r} did not finish by its deadline, {deadline.isoformat()}")
    return f"{type(error).__name__}: {error}"
