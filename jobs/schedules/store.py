"""Every state transition of the schedules' table (``jobs_schedule``).

Each transition is one guarded statement inside ``transaction.atomic`` that succeeds
only from the state that allows it and returns a :class:`ScheduleOutcome` (or raises
a typed error); nothing else writes to the table. Period jobs themselves are created
through the job store's ordinary submission (:func:`jobs.store.submit_many`).

    create_missing ............ (new) -> next_run_at = first period at or after now
    adopt ..................... another timetable declared -> next run recomputed
    advance ................... next_run_at moves forward only, last period recorded
    pause ..................... active -> paused
    resume .................... paused -> active, next run = first period from now
    record_manual_run ......... last job := a job started by hand
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Case, F, Q, Value, When

from ledon.clock import current_time
from ledon.db import alias_for
from ledon.values import from_row

from ..exceptions import InvalidSchedule, InvalidSubmission, InvalidTransition, ScheduleNotFound
from .declarations import ScheduleSpec
from .models import Schedule
from .timetable import CronTimetable, IntervalTimetable, TimetableError
from .types import CatchUp, ScheduleOutcome, ScheduleState

_MICROSECOND = timedelta(microseconds=1)


#: The time a transition is recorded at: ``now`` checked, or the current time.
_now = functools.partial(current_time, error=InvalidSubmission)


def state_of(row: Schedule) -> ScheduleState:
    return from_row(ScheduleState, row, catch_up=CatchUp(row.catch_up))


def timetable_of(state: ScheduleState) -> CronTimetable | IntervalTimetable:
    """The timetable a stored row describes."""
    try:
        if state.cron:
            return CronTimetable.parse(state.cron, state.timezone)
        return IntervalTimetable(state.every_seconds)
    except TimetableError as exc:
        raise InvalidSchedule(f"stored schedule {state.name!r}: {exc}") from exc


def first_period_from(timetable: CronTimetable | IntervalTimetable, moment: datetime) -> datetime:
    """The first period starting at or after ``moment``."""
    return timetable.after(moment - _MICROSECOND)


# --------------------------------------------------------------------------- reads


def states(names: Sequence[str] | None = None) -> dict[str, ScheduleState]:
    """The stored rows of ``names`` (every row when None), by name: one read through
    the unique index of names."""
    rows = Schedule.objects.all()
    if names is not None:
        if not names:
            return {}
        rows = rows.filter(name__in=list(names))
    return {row.name: state_of(row) for row in rows}


def get(name: str) -> ScheduleState:
    """The stored row of ``name``; :class:`ScheduleNotFound` if there is none."""
    row = Schedule.objects.filter(name=name).first()
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r} is stored")
    return state_of(row)


# --------------------------------------------------------------------------- transitions


def _declared_fields(spec: ScheduleSpec) -> dict[str, object]:
    return {
        "cron": spec.cron,
        "every_seconds": spec.every_seconds,
        "timezone": spec.timezone,
        "catch_up": spec.catch_up.value,
        "handler": spec.submission.handler,
        "handler_version": spec.submission.handler_version,
        "queue": spec.submission.queue,
    }


def create_missing(specs: Iterable[ScheduleSpec], *, now: datetime | None = None) -> None:
    """Store a row for each declared schedule that has none, its first period the
    first one starting at or after ``now``; an existing row is left as it is
    (``INSERT … ON CONFLICT DO NOTHING``: concurrent callers never fail)."""
    now = _now(now)
    rows = [
        Schedule(
            name=spec.name,
            next_run_at=first_period_from(spec.timetable, now),
            created_at=now,
            updated_at=now,
            **_declared_fields(spec),
        )
        for spec in specs
    ]
    if rows:
        with transaction.atomic(using=alias_for(Schedule)):
            Schedule.objects.bulk_create(rows, ignore_conflicts=True)


def adopt(spec: ScheduleSpec, *, now: datetime | None = None) -> bool:
    """Bring a stored row up to date with this process's declaration. A changed
    timetable restarts at its first period at or after ``now``; other changes keep
    the next run. True if the row changed; one guarded update."""
    now = _now(now)
    declared = _declared_fields(spec)
    same_timetable = Q(cron=spec.cron, every_seconds=spec.every_seconds, timezone=spec.timezone)
    with transaction.atomic(using=alias_for(Schedule)):
        changed = (
            Schedule.objects.filter(name=spec.name)
            .exclude(**declared)
            .update(
                next_run_at=Case(
                    When(same_timetable, then=F("next_run_at")),
                    default=Value(first_period_from(spec.timetable, now)),
                ),
                updated_at=now,
                **declared,
            )
        )
    return bool(changed)


def advance(
    spec: ScheduleSpec,
    *,
    next_run_at: datetime,
    last_period: datetime | None,
    last_job_id: str,
    now: datetime | None = None,
) -> ScheduleOutcome:
    """Record that the periods before ``next_run_at`` were dealt with (``last_period``
    enqueued, if any). Only forward and only for the same timetable, so a caller with
    an older view (a slower worker, one restarted after a crash) never moves the
    schedule back: ``ALREADY_ADVANCED`` or ``DEFINITION_CHANGED`` then."""
    now = _now(now)
    values: dict[str, object] = {"next_run_at": next_run_at, "updated_at": now}
    if last_period is not None:
        values.update(last_period=last_period, last_job_id=last_job_id, last_enqueued_at=now)
    rows = Schedule.objects.filter(name=spec.name)
    # No savepoint: a pass advances its schedules together in one transaction.
    with transaction.atomic(using=alias_for(Schedule), savepoint=False):
        if rows.filter(
            cron=spec.cron,
            every_seconds=spec.every_seconds,
            timezone=spec.timezone,
            next_run_at__lt=next_run_at,
        ).update(**values):
            return ScheduleOutcome.ADVANCED
        current = rows.values_list("cron", "every_seconds", "timezone").first()
    if current is None:
        raise ScheduleNotFound(f"no schedule named {spec.name!r} is stored")
    if current != spec.timetable_key:
        return ScheduleOutcome.DEFINITION_CHANGED
    return ScheduleOutcome.ALREADY_ADVANCED


def pause(name: str, *, now: datetime | None = None) -> ScheduleOutcome:
    """Stop enqueueing the schedule's periods (``PAUSED``; ``ALREADY_PAUSED``)."""
    now = _now(now)
    rows = Schedule.objects.filter(name=name)
    with transaction.atomic(using=alias_for(Schedule)):
        if rows.filter(paused=False).update(paused=True, paused_at=now, updated_at=now):
            return ScheduleOutcome.PAUSED
        if not rows.exists():
            raise ScheduleNotFound(f"no schedule named {name!r} is stored")
    return ScheduleOutcome.ALREADY_PAUSED


def resume(name: str, *, now: datetime | None = None) -> ScheduleOutcome:
    """Enqueue the schedule's periods again, from the first one starting at or after
    ``now``: periods that began while it was paused are not run (``RESUMED``;
    ``NOT_PAUSED``)."""
    now = _now(now)
    rows = Schedule.objects.filter(name=name)
    for _ in range(3):
        state = get(name)
        if not state.paused:
            return ScheduleOutcome.NOT_PAUSED
        next_run_at = first_period_from(timetable_of(state), now)
        with transaction.atomic(using=alias_for(Schedule)):
            # The timetable is part of the guard: the next run is computed from it.
            if rows.filter(
                paused=True,
                cron=state.cron,
                every_seconds=state.every_seconds,
                timezone=state.timezone,
            ).update(paused=False, paused_at=None, next_run_at=next_run_at, updated_at=now):
                return ScheduleOutcome.RESUMED
    raise InvalidTransition(f"schedule {name!r} kept changing its timetable; resume again")


def record_manual_run(name: str, job_id: str, *, now: datetime | None = None) -> None:
    """Show ``job_id`` (a run started by hand) as the schedule's last run; its
    periods are not touched."""
    now = _now(now)
    with transaction.atomic(using=alias_for(Schedule)):
        if not Schedule.objects.filter(name=name).update(
            last_job_id=job_id, last_enqueued_at=now, updated_at=now
        ):
            raise ScheduleNotFound(f"no schedule named {name!r} is stored")
