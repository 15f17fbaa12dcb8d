"""Periodic jobs: ``@periodic`` schedules, cron or interval, each period's run
one ordinary job in scope ``JOBS["SCHEDULE_SCOPE"]`` whose id names the period.

Imported lazily, like :mod:`jobs`, so that importing the models never imports the
handler registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import exported, lazy_attributes

if TYPE_CHECKING:  # for type checkers; ``as`` marks each name as re-exported
    from .declarations import ScheduleSpec as ScheduleSpec
    from .declarations import periodic as periodic
    from .service import list_schedules as list_schedules
    from .service import pause as pause
    from .service import resume as resume
    from .service import run_now as run_now
    from .types import CatchUp as CatchUp
    from .types import ScheduleOutcome as ScheduleOutcome
    from .types import ScheduleView as ScheduleView

_LAZY = exported(
    {
        "declarations": ("ScheduleSpec", "periodic"),
        "service": ("list_schedules", "pause", "resume", "run_now"),
        "types": ("CatchUp", "ScheduleOutcome", "ScheduleView"),
    }
)
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
