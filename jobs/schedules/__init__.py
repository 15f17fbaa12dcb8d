"""Periodic jobs (SPEC J16): ``@periodic`` schedules, cron or interval, each period's run
one ordinary job in scope ``JOBS["SCHEDULE_SCOPE"]`` whose id names the period.

Imported lazily, like :mod:`jobs`, so that importing the models never imports the
handler registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import lazy_attributes

if TYPE_CHECKING:
    from .registry import ScheduleSpec, periodic
    from .service import list_schedules, pause, resume, run_now
    from .types import CatchUp, ScheduleOutcome, ScheduleView

__all__ = [
    "CatchUp",
    "ScheduleOutcome",
    "ScheduleSpec",
    "ScheduleView",
    "list_schedules",
    "pause",
    "periodic",
    "resume",
    "run_now",
]

_LAZY = {
    "periodic": "registry",
    "ScheduleSpec": "registry",
    "list_schedules": "service",
    "pause": "service",
    "resume": "service",
    "run_now": "service",
    "CatchUp": "types",
    "ScheduleOutcome": "types",
    "ScheduleView": "types",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
