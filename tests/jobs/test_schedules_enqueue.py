"""``enqueue_due_schedules`` with an injected clock: the first period, catch-up
(latest, all, skip), intervals, DST, the idle cost, a crash between enqueueing and
recording, pause / resume / run now, orphaned schedules and changed declarations."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs import JobStatus, JobSubmission, execution, periodic
from jobs.exceptions import (
    AmbientTransactionError,
    ScheduleNotDeclared,
    ScheduleNotFound,
)
from jobs.schedules import declarations, service
from jobs.schedules import store as schedule_store
from jobs.schedules.timetable import CronTimetable
from jobs.schedules.types import ScheduleOutcome
from ledon.faults import add_fault_hook, remove_fault_hook
from tests.support.schedules import T0, period_jobs, row, schedules  # noqa: F401  (fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("schedules")]

HOUR = timedelta(hours=1)


def enqueue(at: datetime) -> list[str]:
    return [job.job_id for job in execution.enqueue_due_schedules(now=at)]


def hourly(name: str = "hourly", **options: object) -> None:
    periodic("0 * * * *", name=name, handler="reports.hourly", **options)


# ------------------------------------------------------------------ the first period


def test_a_new_schedule_starts_at_its_first_period_after_it_was_first_seen():
    hourly()
    assert enqueue(T0 + timedelta(minutes=10)) == []  # no retroactive run of 00:00
    assert row("hourly").next_run_at == T0 + HOUR
    assert row("hourly").created_at == T0 + timedelta(minutes=10)
    assert enqueue(T0 + timedelta(minutes=59, seconds=59)) == []
    assert enqueue(T0 + HOUR) == ["hourly@2026-12-01T01:00:00Z"]
    assert enqueue(T0 + HOUR) == []  # done: nothing is due any more
    assert enqueue(T0 + HOUR + timedelta(minutes=30)) == []
    state = row("hourly")
    assert (state.next_run_at, state.last_period) == (T0 + 2 * HOUR, T0 + HOUR)
    assert state.last_job_id == "hourly@2026-12-01T01:00:00Z"
    job = execution.reserved_scope("periodic").get("hourly@2026-12-01T01:00:00Z")
    assert job is not None
    assert (job.handler, job.status, job.initial_not_before, job.next_run_at) == (
        "reports.hourly",
        JobStatus.QUEUED,
        T0 + HOUR,
        T0 + HOUR,
    )


def test_a_schedule_first_seen_exactly_at_a_period_start_runs_that_period():
    hourly()
    assert enqueue(T0) == ["hourly@2026-12-01T00:00:00Z"]


def test_the_pass_reports_when_the_next_period_starts():
    hourly("a")
    periodic(timedelta(minutes=20), name="b", handler="x.y")
    assert service.enqueue_due(T0 + timedelta(minutes=5)).next_due == T0 + timedelta(minutes=20)
    result = service.enqueue_due(T0 + timedelta(minutes=20))
    assert [j.job_id for j in result.jobs] == ["b@2026-12-01T00:20:00Z"]
    assert result.next_due == T0 + timedelta(minutes=40)


# ------------------------------------------------------------------ catch-up


def after_an_outage(catch_up: str, *, at: datetime = T0 + 5 * HOUR + timedelta(minutes=30)):
    """An hourly schedule seen at 00:10, then no pass until ``at``."""
    hourly(catch_up=catch_up)
    enqueue(T0 + timedelta(minutes=10))
    return execution.enqueue_due_schedules(now=at)


def test_catch_up_latest_enqueues_only_the_most_recent_missed_period():
    jobs = after_an_outage("latest")
    assert [j.job_id for j in jobs] == ["hourly@2026-12-01T05:00:00Z"]
    assert jobs[0].created
    assert row("hourly").next_run_at == T0 + 6 * HOUR
    assert period_jobs() == ["hourly@2026-12-01T05:00:00Z"]


def test_catch_up_all_enqueues_every_missed_period_oldest_first():
    jobs = after_an_outage("all")
    expected = [f"hourly@2026-12-01T0{h}:00:00Z" for h in range(1, 6)]
    assert [j.job_id for j in jobs] == expected
    assert [j.next_run_at for j in jobs] == [T0 + h * HOUR for h in range(1, 6)]
    assert period_jobs() == expected
    assert row("hourly").last_period == T0 + 5 * HOUR


def test_catch_up_all_is_bounded_by_max_catch_up_keeping_the_most_recent(settings):
    settings.JOBS = {**settings.JOBS, "SCHEDULE_MAX_CATCH_UP": 3}
    jobs = after_an_outage("all")
    assert [j.job_id for j in jobs] == [f"hourly@2026-12-01T0{h}:00:00Z" for h in (3, 4, 5)]
    assert row("hourly").next_run_at == T0 + 6 * HOUR


def test_catch_up_skip_runs_only_a_period_that_began_within_the_tolerance(settings):
    settings.JOBS = {**settings.JOBS, "SCHEDULE_TOLERANCE_SECONDS": 60}
    assert [
        j.job_id for j in after_an_outage("skip", at=T0 + 5 * HOUR + timedelta(seconds=59))
    ] == ["hourly@2026-12-01T05:00:00Z"]


def test_catch_up_skip_skips_a_period_that_began_too_long_ago(settings):
    settings.JOBS = {**settings.JOBS, "SCHEDULE_TOLERANCE_SECONDS": 60}
    assert after_an_outage("skip", at=T0 + 5 * HOUR + timedelta(seconds=61)) == []
    state = row("hourly")
    assert (state.next_run_at, state.last_period) == (T0 + 6 * HOUR, None)
    assert period_jobs() == []
    assert enqueue(T0 + 6 * HOUR) == ["hourly@2026-12-01T06:00:00Z"]  # on time again


# ------------------------------------------------------------------ intervals and DST


def test_interval_periods_are_aligned_to_the_epoch_whenever_first_seen():
    periodic(timedelta(minutes=15), name="quarter", handler="x.y", catch_up="all")
    assert enqueue(T0 + timedelta(minutes=7, seconds=13)) == []
    assert row("quarter").next_run_at == T0 + timedelta(minutes=15)
    assert enqueue(T0 + timedelta(minutes=46)) == [
        "quarter@2026-12-01T00:15:00Z",
        "quarter@2026-12-01T00:30:00Z",
        "quarter@2026-12-01T00:45:00Z",
    ]


def test_spring_forward_in_paris_runs_the_skipped_time_at_three():
    periodic("30 2 * * *", name="nightly", handler="x.y", timezone="Europe/Paris")
    night = datetime(2026, 3, 28, 23, tzinfo=UTC)
    assert enqueue(night) == []
    assert row("nightly").next_run_at == datetime(2026, 3, 29, 1, tzinfo=UTC)  # 03:00 CEST
    assert enqueue(datetime(2026, 3, 29, 0, 59, 59, tzinfo=UTC)) == []
    assert enqueue(datetime(2026, 3, 29, 1, tzinfo=UTC)) == ["nightly@2026-03-29T01:00:00Z"]
    assert row("nightly").next_run_at == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)  # 02:30 CEST


def test_fall_back_in_new_york_runs_the_repeated_time_once():
    periodic("30 1 * * *", name="nightly", handler="x.y", timezone="America/New_York")
    enqueue(datetime(2026, 11, 1, 4, tzinfo=UTC))  # 00:00 EDT
    assert enqueue(datetime(2026, 11, 1, 5, 30, tzinfo=UTC)) == ["nightly@2026-11-01T05:30:00Z"]
    # 01:30 EST, the repeated local time, an hour later: not a period.
    assert enqueue(datetime(2026, 11, 1, 6, 30, tzinfo=UTC)) == []
    assert row("nightly").next_run_at == datetime(2026, 11, 2, 6, 30, tzinfo=UTC)
    assert period_jobs() == ["nightly@2026-11-01T05:30:00Z"]


# ------------------------------------------------------------------ cost and idempotence


def test_a_pass_with_nothing_due_is_one_read_and_no_write():
    for n in range(50):
        periodic(f"{n % 60} 6 * * *", name=f"s-{n:02}", handler="x.y")
    enqueue(T0)  # stores the 50 rows
    with CaptureQueriesContext(connection) as queries:
        assert enqueue(T0 + timedelta(minutes=1)) == []
    assert len(queries) == 1
    assert queries[0]["sql"].lstrip().upper().startswith("SELECT")
    assert "jobs_schedule" in queries[0]["sql"]


def test_no_schedule_declared_costs_nothing():
    with CaptureQueriesContext(connection) as queries:
        assert execution.enqueue_due_schedules(now=T0) == []
    assert len(queries) == 0


def test_repeated_passes_with_the_same_clock_are_idempotent():
    hourly(catch_up="all")
    enqueue(T0 + timedelta(minutes=10))
    first = enqueue(T0 + 3 * HOUR)
    assert len(first) == 3
    for _ in range(3):
        assert enqueue(T0 + 3 * HOUR) == []
    assert period_jobs() == first


def test_a_crash_between_enqueue_and_state_update_loses_and_doubles_nothing():
    hourly(catch_up="all")
    enqueue(T0 + timedelta(minutes=10))

    class Crash(Exception):
        pass

    def crash(point: str, context: dict[str, object]) -> None:
        if point == "jobs.schedules.enqueued":
            raise Crash(point)

    add_fault_hook(crash)
    try:
        with pytest.raises(Crash):
            enqueue(T0 + 2 * HOUR)
    finally:
        remove_fault_hook(crash)
    # The jobs committed; the schedule still says they are due.
    assert period_jobs() == ["hourly@2026-12-01T01:00:00Z", "hourly@2026-12-01T02:00:00Z"]
    assert row("hourly").next_run_at == T0 + HOUR
    again = execution.enqueue_due_schedules(now=T0 + 2 * HOUR + timedelta(minutes=5))
    assert [(j.job_id, j.created) for j in again] == [
        ("hourly@2026-12-01T01:00:00Z", False),
        ("hourly@2026-12-01T02:00:00Z", False),
    ]
    assert period_jobs() == ["hourly@2026-12-01T01:00:00Z", "hourly@2026-12-01T02:00:00Z"]
    assert row("hourly").next_run_at == T0 + 3 * HOUR


def test_a_period_whose_job_exists_with_another_request_counts_as_enqueued(caplog):
    hourly()
    enqueue(T0 + timedelta(minutes=10))
    execution.reserved_scope("periodic").submit(
        "hourly@2026-12-01T01:00:00Z", JobSubmission.create("other.handler")
    )
    with caplog.at_level(logging.WARNING, logger="jobs.schedules.service"):
        assert enqueue(T0 + HOUR) == []
    assert "already exists in this scope with different" in caplog.text
    assert row("hourly").next_run_at == T0 + 2 * HOUR


def test_enqueue_refuses_to_run_inside_a_transaction():
    hourly()
    enqueue(T0 + timedelta(minutes=10))
    with transaction.atomic(), pytest.raises(AmbientTransactionError):
        enqueue(T0 + HOUR)


# ------------------------------------------------------------------ pause, resume, run now


def test_a_paused_schedule_enqueues_nothing_and_resumes_from_the_next_period():
    hourly(catch_up="all")
    enqueue(T0 + timedelta(minutes=10))
    assert service.pause("hourly", now=T0 + timedelta(minutes=20)) is ScheduleOutcome.PAUSED
    assert service.pause("hourly") is ScheduleOutcome.ALREADY_PAUSED
    assert not ScheduleOutcome.ALREADY_PAUSED
    assert enqueue(T0 + 3 * HOUR) == []
    assert row("hourly").paused
    resumed_at = T0 + 3 * HOUR + timedelta(minutes=5)
    assert service.resume("hourly", now=resumed_at) is ScheduleOutcome.RESUMED
    assert service.resume("hourly") is ScheduleOutcome.NOT_PAUSED
    # The periods that began while paused are not caught up.
    assert row("hourly").next_run_at == T0 + 4 * HOUR
    assert enqueue(resumed_at) == []
    assert enqueue(T0 + 4 * HOUR) == ["hourly@2026-12-01T04:00:00Z"]
    assert period_jobs() == ["hourly@2026-12-01T04:00:00Z"]


def test_steering_an_unknown_schedule_is_a_typed_error():
    with pytest.raises(ScheduleNotFound):
        service.pause("nope")
    with pytest.raises(ScheduleNotFound):
        service.resume("nope")
    with pytest.raises(ScheduleNotDeclared):
        service.run_now("nope")


def test_run_now_enqueues_an_ordinary_job_with_a_distinct_id():
    hourly(payload={"full": True})
    enqueue(T0 + timedelta(minutes=10))
    at = T0 + timedelta(minutes=12, seconds=3, microseconds=250)
    job = service.run_now("hourly", now=at)
    assert job.job_id == "hourly@manual-2026-12-01T00:12:03.000250Z"
    assert (job.handler, job.payload, job.initial_not_before) == (
        "reports.hourly",
        {"full": True},
        None,
    )
    state = row("hourly")
    assert state.last_job_id == job.job_id
    assert (state.next_run_at, state.last_period) == (T0 + HOUR, None)  # periods untouched
    assert enqueue(T0 + HOUR) == ["hourly@2026-12-01T01:00:00Z"]


# ------------------------------------------------------------------ orphans and deploys


def test_a_schedule_removed_from_the_code_is_orphaned_and_never_enqueued():
    hourly("kept")
    hourly("removed")
    enqueue(T0 + timedelta(minutes=10))
    declarations.unregister("removed")
    assert enqueue(T0 + 2 * HOUR) == ["kept@2026-12-01T02:00:00Z"]
    views = {view.name: view for view in service.list_schedules()}
    assert views["removed"].state == "orphaned"
    assert views["removed"].next_run_at is None
    assert views["kept"].state == "active"
    assert row("removed").last_period is None
    with pytest.raises(ScheduleNotDeclared):
        service.run_now("removed")


def test_a_changed_timetable_is_adopted_and_restarts_at_its_next_period():
    hourly("report")
    enqueue(T0 + timedelta(minutes=10))
    assert row("report").next_run_at == T0 + HOUR
    declarations.unregister("report")
    periodic("30 * * * *", name="report", handler="reports.hourly")  # a new deploy
    assert enqueue(T0 + timedelta(minutes=20)) == []
    assert (row("report").cron, row("report").next_run_at) == (
        "30 * * * *",
        T0 + timedelta(minutes=30),
    )
    assert enqueue(T0 + timedelta(minutes=30)) == ["report@2026-12-01T00:30:00Z"]


def test_a_schedule_stored_with_another_versions_timetable_is_left_alone(caplog):
    hourly("report")
    enqueue(T0 + timedelta(minutes=10))
    # Workers of another version, started later, declare it every five minutes and
    # stored that: they own the schedule now.
    ours = declarations.get("report")
    assert ours is not None
    theirs = replace(ours, cron="*/5 * * * *", timetable=CronTimetable.parse("*/5 * * * *"))
    assert schedule_store.adopt(theirs, now=T0 + timedelta(minutes=11))
    with caplog.at_level(logging.WARNING, logger="jobs.schedules.service"):
        assert enqueue(T0 + 2 * HOUR) == []
        assert enqueue(T0 + 3 * HOUR) == []
    assert caplog.text.count("another timetable") == 1  # said once, not at every pass
    assert row("report").next_run_at == T0 + timedelta(minutes=15)  # theirs, untouched
    assert [v.state for v in service.list_schedules() if v.name == "report"] == [
        "defined differently"
    ]
