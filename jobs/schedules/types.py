"""Values of the schedules that cross the store's boundary."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from django.db import models


class CatchUp(models.TextChoices):
    """What a schedule enqueues when several of its periods began since the last pass
    (all workers were stopped, or the schedule was overdue for another reason)."""

    #: Only the most recent period that began (the default).
    LATEST = "latest", "Latest"
    #: Every period that began, oldest first, at most ``JOBS["SCHEDULE_MAX_CATCH_UP"]``
    #: (the most recent ones).
    ALL = "all", "All"
    #: Only a period that began less than ``JOBS["SCHEDULE_TOLERANCE_SECONDS"]`` ago.
    SKIP = "skip", "Skip"


class ScheduleOutcome(enum.Enum):
    """What a transition of a schedule's stored state did. Falsy when nothing changed."""

    ADVANCED = "advanced"  # the enqueued periods were recorded, the next run moved on
    ALREADY_ADVANCED = "already_advanced"  # another caller recorded them first
    DEFINITION_CHANGED = "definition_changed"  # the row now holds another timetable
    PAUSED = "paused"
    ALREADY_PAUSED = "already_paused"
    RESUMED = "resumed"
    NOT_PAUSED = "not_paused"

    def __bool__(self) -> bool:
        return self in (ScheduleOutcome.ADVANCED, ScheduleOutcome.PAUSED, ScheduleOutcome.RESUMED)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleState:
    """One schedule's stored row (``jobs_schedule``) as read."""

    name: str
    cron: str
    every_seconds: int
    timezone: str
    catch_up: CatchUp
    handler: str
    handler_version: int
    queue: str
    next_run_at: datetime
    last_period: datetime | None
    last_job_id: str
    last_enqueued_at: datetime | None
    paused: bool
    paused_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @property
    def timetable_key(self) -> tuple[str, int, str]:
        """What decides the periods: (cron, every_seconds, timezone)."""
        return (self.cron, self.every_seconds, self.timezone)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleView:
    """A schedule as ``list_schedules`` and the admin show it: declared in this
    process's code, stored, or both."""

    name: str
    timetable: str
    timezone: str
    catch_up: str
    handler: str
    next_run_at: datetime | None
    last_period: datetime | None
    last_job_id: str
    last_job_status: str | None
    paused: bool
    #: "active", "paused", "orphaned" (stored, no longer declared: never enqueued),
    #: "not stored yet" (declared; no worker has seen it yet) or "defined differently"
    #: (this process declares another timetable than the stored one).
    state: str
