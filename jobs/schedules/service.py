"""Enqueueing what is due, and the operators' steering of schedules.

One pass (:func:`enqueue_due`) reads the stored rows of this process's declared
schedules — one read through the unique index of names; nothing else when nothing is
due —, creates the jobs of the periods that began, then advances each schedule's
state with a guarded update that only moves forward. A period's job id names the
period, so any number of passes racing in threads, processes and machines create
exactly one job per period: the losers find the winner's job. A crash between
the two steps loses nothing and doubles nothing: the next pass finds the same due
periods, and their jobs already exist.

Fault point (see ``ledon.faults``), for crash tests:

``jobs.schedules.enqueued``
    the due periods' jobs are committed; the schedules' state is not updated yet
    (``names``: the schedules concerned).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from ledon.db import alias_for
from ledon.faults import fault_point

from .. import store as job_store
from .. import validation
from ..conf import jobs_settings
from ..exceptions import ScheduleNotDeclared
from ..models import Job
from ..types import JobSnapshot, JobStatus
from . import declarations
from . import store as schedule_store
from .declarations import ScheduleSpec
from .models import Schedule
from .types import CatchUp, ScheduleOutcome, ScheduleState, ScheduleView

logger = logging.getLogger(__name__)

__all__ = [
    "EnqueuePass",
    "due_periods",
    "enqueue_due",
    "enqueue_due_schedules",
    "list_schedules",
    "pause",
    "resume",
    "run_now",
    "sync",
]


@dataclass(frozen=True, slots=True)
class EnqueuePass:
    """What one pass did: the jobs of the periods it enqueued (``created`` False for
    a job another caller created first), and when this process's next period starts."""

    jobs: list[JobSnapshot]
    next_due: datetime | None


def scope_hash() -> str:
    """The scope hash of every period's job: the reserved scope
    ``JOBS["SCHEDULE_SCOPE"]``, which no tenant's ``JobScope`` reaches."""
    return validation.reserved_scope_hash(jobs_settings().SCHEDULE_SCOPE)


def due_periods(spec: ScheduleSpec, next_run_at: datetime, now: datetime) -> list[datetime]:
    """The period starts to enqueue, oldest first, when the schedule's next run was
    ``next_run_at`` and it is now ``now``, by the schedule's ``catch_up``."""
    if next_run_at > now:
        return []
    latest = spec.timetable.at_or_before(now)
    if latest < next_run_at:
        return []
    if spec.catch_up is CatchUp.LATEST:
        return [latest]
    settings = jobs_settings()
    if spec.catch_up is CatchUp.SKIP:
        recent = now - latest < timedelta(seconds=settings.SCHEDULE_TOLERANCE_SECONDS)
        return [latest] if recent else []
    periods = [latest]
    while len(periods) < settings.SCHEDULE_MAX_CATCH_UP:
        earlier = spec.timetable.at_or_before(periods[-1] - timedelta(microseconds=1))
        if earlier < next_run_at:
            break
        periods.append(earlier)
    return periods[::-1]


_adopted: set[tuple[str, int]] = set()
_warned: set[tuple[str, tuple[str, int, str]]] = set()
_memo_lock = threading.Lock()


def sync(*, now: datetime | None = None) -> list[ScheduleSpec]:
    """Store a row for every declared schedule that has none, and bring the stored
    rows of the others up to date with this process's declarations (a deploy that
    changed a timetable: the workers started last own it). Every ``run_jobs`` worker
    does this at start-up; :func:`enqueue_due` once per process."""
    specs = declarations.declared()
    when = schedule_store._now(now)
    schedule_store.create_missing(specs, now=when)
    rows = schedule_store.states([spec.name for spec in specs])
    for spec in specs:
        row = rows.get(spec.name)
        if row is not None and _differs(spec, row) and schedule_store.adopt(spec, now=when):
            logger.info(
                "schedule %s: stored declaration updated (%s)",
                spec.name,
                spec.expression,
                extra={"schedule": spec.name},
            )
    with _memo_lock:
        _adopted.add((alias_for(Schedule), declarations.generation()))
    return specs


def _differs(spec: ScheduleSpec, row: ScheduleState) -> bool:
    return (
        row.timetable_key != spec.timetable_key
        or row.catch_up is not spec.catch_up
        or (row.handler, row.handler_version, row.queue)
        != (spec.submission.handler, spec.submission.handler_version, spec.submission.queue)
    )


def enqueue_due(now: datetime | None = None) -> EnqueuePass:
    """Enqueue the periods of this process's schedules that are due as of ``now``.

    Idempotent and safe from many threads and processes at once. When nothing is due
    it is one read and no write. Refuses to run inside ``transaction.atomic`` (the
    jobs are submitted in short transactions of their own).
    """
    now = schedule_store._now(now)
    specs = declarations.declared()
    if not specs:
        return EnqueuePass([], None)
    with _memo_lock:
        adopted = (alias_for(Schedule), declarations.generation()) in _adopted
    if not adopted:
        sync(now=now)
    names = [spec.name for spec in specs]
    rows = schedule_store.states(names)
    if len(rows) < len(specs):  # rows deleted by hand, or tables flushed: store again
        schedule_store.create_missing([s for s in specs if s.name not in rows], now=now)
        rows = schedule_store.states(names)
    plans: list[tuple[ScheduleSpec, list[datetime], datetime]] = []
    next_due: datetime | None = None
    for spec in specs:
        row = rows.get(spec.name)
        if row is None or row.paused or not _owned(spec, row):
            continue
        if row.next_run_at > now:
            next_due = row.next_run_at if next_due is None else min(next_due, row.next_run_at)
            continue
        following = spec.timetable.after(now)
        plans.append((spec, due_periods(spec, row.next_run_at, now), following))
        next_due = following if next_due is None else min(next_due, following)
    if not plans:
        return EnqueuePass([], next_due)
    return EnqueuePass(_enqueue(plans, now), next_due)


def _owned(spec: ScheduleSpec, row: ScheduleState) -> bool:
    """Whether the stored timetable is this process's: if another deploy's workers
    declare another one, they own the schedule and this process leaves it alone."""
    if row.timetable_key == spec.timetable_key:
        return True
    key = (spec.name, row.timetable_key)
    with _memo_lock:
        first = key not in _warned
        _warned.add(key)
    if first:
        logger.warning(
            "schedule %s is stored with another timetable (%s) than this process declares "
            "(%s): workers of another version own it; this one leaves it alone until it "
            "restarts",
            spec.name,
            row.cron or f"every {row.every_seconds}s",
            spec.expression,
            extra={"schedule": spec.name},
        )
    return False


def _enqueue(
    plans: list[tuple[ScheduleSpec, list[datetime], datetime]], now: datetime
) -> list[JobSnapshot]:
    scope = scope_hash()
    # Sorted by job id: concurrent passes insert (and wait for) identities in one
    # order, so they never deadlock on each other's rows.
    items = sorted(
        (
            (scope, spec.job_id(period), spec.period_submission(period))
            for spec, periods, _following in plans
            for period in periods
        ),
        key=lambda item: item[1],
    )
    results = job_store.submit_many(items, now=now) if items else []
    fault_point("jobs.schedules.enqueued", names=[spec.name for spec, _p, _f in plans])
    jobs: list[JobSnapshot] = []
    for result in results:
        if result.conflict is not None:
            # The period's job exists with another request (a deploy changed the
            # payload or queue meanwhile): the period has its job all the same.
            logger.warning("schedule period %s: %s", result.job_id, result.conflict)
        elif result.snapshot is not None:
            jobs.append(result.snapshot)
    with transaction.atomic(using=alias_for(Schedule)):
        for spec, periods, following in sorted(plans, key=lambda plan: plan[0].name):
            last = periods[-1] if periods else None
            outcome = schedule_store.advance(
                spec,
                next_run_at=following,
                last_period=last,
                last_job_id=spec.job_id(last) if last is not None else "",
                now=now,
            )
            if outcome is ScheduleOutcome.DEFINITION_CHANGED:
                logger.warning("schedule %s changed its timetable during the pass", spec.name)
    jobs.sort(key=lambda snap: (snap.initial_not_before or now, snap.job_id))
    return jobs


def enqueue_due_schedules(now: datetime | None = None) -> list[JobSnapshot]:
    """The jobs of the periods due as of ``now`` (default: the current time) that this
    call enqueued, oldest period first. See :func:`jobs.execution.enqueue_due_schedules`."""
    return enqueue_due(now).jobs


# --------------------------------------------------------------------------- steering


def _declared(name: str) -> ScheduleSpec:
    spec = declarations.get(name)
    if spec is None:
        # A shell or a view has not imported the apps' tasks modules, where schedules
        # are declared, as a worker and the admin have: import them, once.
        declarations.discover()
        spec = declarations.get(name)
    if spec is None:
        raise ScheduleNotDeclared(
            f"no schedule named {name!r} is declared in this process's code; an orphaned "
            "schedule cannot run"
        )
    return spec


def run_now(name: str, *, now: datetime | None = None) -> JobSnapshot:
    """Enqueue one extra run of the schedule at once, as an ordinary job with the id
    ``"{name}@manual-{UTC time with microseconds}Z"``; its periods are not touched."""
    when = schedule_store._now(now)
    spec = _declared(name)
    job = job_store.submit(scope_hash(), spec.manual_job_id(when), spec.submission, now=when)
    schedule_store.create_missing([spec], now=when)
    schedule_store.record_manual_run(name, job.job_id, now=when)
    return job


def pause(name: str, *, now: datetime | None = None) -> ScheduleOutcome:
    """Stop enqueueing the schedule's periods (every worker, at its next pass)."""
    return schedule_store.pause(name, now=now)


def resume(name: str, *, now: datetime | None = None) -> ScheduleOutcome:
    """Enqueue the schedule's periods again, from the first starting at or after now."""
    return schedule_store.resume(name, now=now)


# --------------------------------------------------------------------------- reading


def list_schedules() -> list[ScheduleView]:
    """Every schedule declared in this process's code or stored, by name, with its
    next run, its last run's job and that job's status."""
    declarations.discover()
    specs = {spec.name: spec for spec in declarations.declared()}
    rows = schedule_store.states()
    last_ids = [row.last_job_id for row in rows.values() if row.last_job_id]
    statuses = dict(
        Job.objects.for_scope(scope_hash())
        .filter(job_id__in=last_ids)
        .values_list("job_id", "status")
    )
    views = []
    for name in sorted(set(specs) | set(rows)):
        spec, row = specs.get(name), rows.get(name)
        if row is None:
            assert spec is not None
            views.append(_declared_view(spec))
            continue
        if spec is None:
            state = "orphaned"
        elif spec.timetable_key != row.timetable_key:
            state = "defined differently"
        else:
            state = "paused" if row.paused else "active"
        timetable = schedule_store.timetable_of(row)
        status = statuses.get(row.last_job_id)
        views.append(
            ScheduleView(
                name=name,
                timetable=timetable.describe(),
                timezone=row.timezone,
                catch_up=row.catch_up.value,
                handler=f"{row.handler}@{row.handler_version}",
                next_run_at=None if row.paused or spec is None else row.next_run_at,
                last_period=row.last_period,
                last_job_id=row.last_job_id,
                last_job_status=JobStatus(status).label if status else None,
                paused=row.paused,
                state=state,
            )
        )
    return views


def _declared_view(spec: ScheduleSpec) -> ScheduleView:
    return ScheduleView(
        name=spec.name,
        timetable=spec.describe(),
        timezone=spec.timezone,
        catch_up=spec.catch_up.value,
        handler=f"{spec.submission.handler}@{spec.submission.handler_version}",
        next_run_at=schedule_store.first_period_from(spec.timetable, schedule_store._now(None)),
        last_period=None,
        last_job_id="",
        last_job_status=None,
        paused=False,
        state="not stored yet",
    )
