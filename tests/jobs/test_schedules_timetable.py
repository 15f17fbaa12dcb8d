"""Timetables: cron in a time zone by the DST rule (Europe/Paris and
America/New_York at both transitions of 2026), aliases, intervals anchored to the
Unix epoch, and the job id of a period. Pure computation: no database."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from jobs.schedules.timetable import (
    CronTimetable,
    IntervalTimetable,
    TimetableError,
    job_id_time,
)

PARIS = "Europe/Paris"
NEW_YORK = "America/New_York"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def runs(expression: str, zone: str, start: datetime, end: datetime) -> list[str]:
    """Every period start in [start, end), as local time with its offset."""
    timetable = CronTimetable.parse(expression, zone)
    found, moment = [], start - timedelta(microseconds=1)
    while (moment := timetable.after(moment)) < end:
        found.append(moment.astimezone(ZoneInfo(zone)).strftime("%m-%d %H:%M%z"))
    return found


# ------------------------------------------------------------------ spring: a skipped time


@pytest.mark.parametrize(
    ("zone", "day", "skipped_at_utc"),
    [
        # 2026-03-29 02:00 CET -> 03:00 CEST in Paris; 2026-03-08 02:00 EST -> 03:00 EDT.
        (PARIS, utc(2026, 3, 28, 12), utc(2026, 3, 29, 1)),
        (NEW_YORK, utc(2026, 3, 7, 12), utc(2026, 3, 8, 7)),
    ],
)
def test_a_local_time_skipped_in_spring_runs_at_the_first_instant_after_the_gap(
    zone, day, skipped_at_utc
):
    timetable = CronTimetable.parse("30 2 * * *", zone)
    first = timetable.after(day)
    assert first == skipped_at_utc  # 03:00 local: the first instant after 02:59:59
    assert first.astimezone(ZoneInfo(zone)).strftime("%H:%M") == "03:00"
    # The next day it is 02:30 again, once.
    assert timetable.after(first).astimezone(ZoneInfo(zone)).strftime("%d %H:%M") in (
        "30 02:30",
        "09 02:30",
    )


def test_spring_paris_every_expression_kind():
    day = (utc(2026, 3, 28, 23), utc(2026, 3, 29, 3))
    assert runs("30 2 * * *", PARIS, *day) == ["03-29 03:00+0200"]
    # Several skipped local times (02:00 … 02:45) run once, at 03:00, which is also
    # a period of its own: one period, not five.
    assert runs("*/15 * * * *", PARIS, utc(2026, 3, 29, 0, 40), utc(2026, 3, 29, 1, 20)) == [
        "03-29 01:45+0100",
        "03-29 03:00+0200",
        "03-29 03:15+0200",
    ]
    assert runs("@hourly", PARIS, *day) == [
        "03-29 00:00+0100",
        "03-29 01:00+0100",
        "03-29 03:00+0200",
        "03-29 04:00+0200",
    ]
    assert runs("15 3 * * *", PARIS, *day) == ["03-29 03:15+0200"]  # not skipped


def test_spring_new_york():
    day = (utc(2026, 3, 8, 5), utc(2026, 3, 8, 9))
    assert runs("0 2 * * *", NEW_YORK, *day) == ["03-08 03:00-0400"]
    assert runs("30 1,2,3 * * *", NEW_YORK, *day) == [
        "03-08 01:30-0500",
        "03-08 03:00-0400",
        "03-08 03:30-0400",
    ]


# ------------------------------------------------------------------ autumn: a repeated time


@pytest.mark.parametrize(
    ("zone", "expression", "day", "once"),
    [
        # 2026-10-25 03:00 CEST -> 02:00 CET: 02:xx happens twice in Paris.
        (PARIS, "30 2 * * *", (utc(2026, 10, 24, 20), utc(2026, 10, 25, 6)), "10-25 02:30+0200"),
        # 2026-11-01 02:00 EDT -> 01:00 EST: 01:xx happens twice in New York.
        (NEW_YORK, "30 1 * * *", (utc(2026, 11, 1, 0), utc(2026, 11, 1, 12)), "11-01 01:30-0400"),
    ],
)
def test_a_local_time_repeated_in_autumn_runs_once(zone, expression, day, once):
    assert runs(expression, zone, *day) == [once]  # its first occurrence, not both


def test_autumn_frequent_expressions_run_each_local_time_once_too():
    # The repeated hour's second pass has no run: each matching local time runs once.
    assert runs("*/30 * * * *", PARIS, utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 2, 30)) == [
        "10-25 01:30+0200",
        "10-25 02:00+0200",
        "10-25 02:30+0200",
        "10-25 03:00+0100",
    ]
    assert runs("0 * * * *", NEW_YORK, utc(2026, 11, 1, 4), utc(2026, 11, 1, 8, 30)) == [
        "11-01 00:00-0400",
        "11-01 01:00-0400",
        "11-01 02:00-0500",
        "11-01 03:00-0500",
    ]


def test_at_or_before_inside_the_repeated_hour_is_the_first_passes_last_period():
    timetable = CronTimetable.parse("*/10 * * * *", PARIS)
    # 02:20 CET (second pass) = 01:20Z. The last period before it is 02:50 CEST
    # (00:50Z): the second pass has none of its own.
    assert timetable.at_or_before(utc(2026, 10, 25, 1, 20)) == utc(2026, 10, 25, 0, 50)
    assert timetable.after(utc(2026, 10, 25, 1, 20)) == utc(2026, 10, 25, 2, 0)  # 03:00 CET


@pytest.mark.parametrize("zone", [PARIS, NEW_YORK, "Australia/Lord_Howe", "UTC"])
@pytest.mark.parametrize("expression", ["*/7 * * * *", "30 2 * * *", "15 1,2,3 * * *"])
@pytest.mark.parametrize(
    "window", [(utc(2026, 3, 6), utc(2026, 4, 1)), (utc(2026, 10, 23), utc(2026, 11, 4))]
)
def test_after_and_at_or_before_agree_around_the_transitions(zone, expression, window):
    timetable = CronTimetable.parse(expression, zone)
    periods, moment = [], window[0]
    while (moment := timetable.after(moment)) < window[1]:
        periods.append(moment)
    assert periods == sorted(set(periods))  # strictly increasing: nothing runs twice
    for before, after in itertools.pairwise(periods):
        assert timetable.at_or_before(after - timedelta(microseconds=1)) == before
        assert timetable.at_or_before(after) == after
        assert timetable.after(before) == after


# ------------------------------------------------------------------ expressions and zones


def test_aliases_are_the_five_fields_they_stand_for():
    assert CronTimetable.parse("@hourly").expression == "0 * * * *"
    assert CronTimetable.parse("@daily").expression == "0 0 * * *"
    assert CronTimetable.parse("@weekly").expression == "0 0 * * 0"
    assert CronTimetable.parse("@monthly").expression == "0 0 1 * *"
    assert CronTimetable.parse("@yearly").expression == "0 0 1 1 *"
    assert CronTimetable.parse("  0   6 * * MON-FRI ").expression == "0 6 * * MON-FRI"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "invalid cron expression"),
        ("0 6 * *", "five fields"),
        ("0 0 6 * * *", "five fields"),  # seconds are not part of a period
        ("@reboot", "unknown cron alias"),
        ("* * */20 * 1L", "never matches"),  # the 1st or 21st that is a last Monday
        ("", "five fields"),
        (6, "is a str"),
    ],
)
def test_bad_expressions_are_refused(expression, message):
    with pytest.raises(TimetableError, match=message):
        CronTimetable.parse(expression)


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../../etc/passwd", "", None])
def test_unknown_zones_are_refused(zone):
    with pytest.raises(TimetableError, match="time zone"):
        CronTimetable.parse("0 6 * * *", zone)


def test_describe_says_it_in_words():
    assert CronTimetable.parse("0 6 * * *", PARIS).describe() == (
        "At 06:00 every day (Europe/Paris)"
    )


# ------------------------------------------------------------------ intervals


def test_intervals_are_anchored_to_the_unix_epoch():
    every_7 = IntervalTimetable.parse(timedelta(minutes=7))
    moment = utc(2026, 5, 5, 12, 3, 30)
    start = every_7.at_or_before(moment)
    assert (start - utc(1970, 1, 1)) % timedelta(minutes=7) == timedelta(0)
    assert start <= moment < start + timedelta(minutes=7)
    assert every_7.after(moment) == start + timedelta(minutes=7)
    assert every_7.after(start) == start + timedelta(minutes=7)  # strictly after
    assert every_7.at_or_before(start) == start
    hourly = IntervalTimetable.parse(timedelta(hours=1))
    assert hourly.after(moment) == utc(2026, 5, 5, 13)


@pytest.mark.parametrize(
    "every",
    [timedelta(0), timedelta(seconds=-5), timedelta(milliseconds=1500), timedelta(days=30_000), 60],
)
def test_bad_intervals_are_refused(every):
    with pytest.raises(TimetableError):
        IntervalTimetable.parse(every)


def test_job_ids_carry_the_period_start_in_utc_with_seconds_and_z():
    paris_six = datetime(2026, 12, 1, 6, 0, tzinfo=ZoneInfo(PARIS))
    assert job_id_time(paris_six) == "2026-12-01T05:00:00Z"
