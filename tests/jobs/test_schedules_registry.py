"""Schedule declarations: ``@periodic`` stacked on handlers (both orders) and on django.tasks
tasks, the function form, and the typed error for every bad declaration."""

from __future__ import annotations

import json
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest

from jobs import JobContext, job_handler, periodic
from jobs.backends.compat import task
from jobs.exceptions import InvalidSchedule, JobsConfigurationError, JobsError
from jobs.schedules import declarations
from jobs.schedules.types import CatchUp
from tests.support.schedules import T0, schedules  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("schedules")


def test_periodic_above_job_handler_declares_the_handler_schedule():
    @periodic(
        "0 6 * * *",
        name="daily-report",
        timezone="Europe/Paris",
        payload={"format": "pdf"},
        queue="reports",
        priority=5,
        max_attempts=3,
    )
    @job_handler("reports.daily", version=2)
    def daily(ctx: JobContext) -> None:
        return None

    (spec,) = declarations.declared()
    assert spec.name == "daily-report"
    assert (spec.cron, spec.every_seconds, spec.timezone) == ("0 6 * * *", 0, "Europe/Paris")
    assert spec.catch_up is CatchUp.LATEST
    sub = spec.submission
    assert (sub.handler, sub.handler_version, sub.queue, sub.priority, sub.max_attempts) == (
        "reports.daily",
        2,
        "reports",
        5,
        3,
    )
    assert json.loads(sub.payload_json) == {"format": "pdf"}
    assert spec.job_id(T0 + timedelta(hours=5)) == "daily-report@2026-12-01T05:00:00Z"
    period = spec.period_submission(T0)
    assert period.initial_not_before == T0  # due from the period start
    assert callable(daily)  # the decorator returns the function


def test_job_handler_above_periodic_is_resolved_once_registered():
    @job_handler("reports.hourly")
    @periodic("@hourly", name="hourly")
    def hourly(ctx: JobContext) -> None:
        return None

    (spec,) = declarations.declared()
    assert spec.submission.handler == "reports.hourly"
    assert spec.cron == "0 * * * *"


def test_periodic_on_a_plain_function_is_an_error_when_schedules_are_read():
    @periodic("@daily", name="orphan-function")
    def not_a_handler(ctx: JobContext) -> None:
        return None

    with pytest.raises(InvalidSchedule, match="not a registered @job_handler"):
        declarations.declared()


def test_the_function_form_names_a_handler_registered_elsewhere():
    spec = periodic(
        timedelta(minutes=15), name="crm-sync", handler="crm.sync", version=3, catch_up="all"
    )
    assert declarations.get("crm-sync") == spec
    assert (spec.every_seconds, spec.timezone, spec.catch_up) == (900, "UTC", CatchUp.ALL)
    assert (spec.submission.handler, spec.submission.handler_version) == ("crm.sync", 3)
    every = periodic(every=timedelta(hours=1), name="every-hour", handler="x.y")
    assert every.every_seconds == 3600


@task(queue_name="default", priority=3)
def send_digest(day: str, *, loud: bool = False) -> int:
    return 1


def test_a_task_is_scheduled_as_the_backend_would_enqueue_it():
    spec = periodic(
        "0 7 * * 1", name="digest", handler=send_digest, args=["mon"], kwargs={"loud": True}
    )
    sub = spec.submission
    assert (sub.handler, sub.handler_version, sub.priority) == ("django.tasks", 1, 3)
    assert json.loads(sub.payload_json) == {
        "task": send_digest.module_path,
        "backend": "default",
        "args": ["mon"],
        "kwargs": {"loud": True},
    }
    assert spec.target == f"task {send_digest.module_path}"


def test_periodic_above_task_as_a_decorator():
    # What ``@periodic(...)`` stacked above ``@task`` does to the module-level task.
    decorated = periodic("*/5 * * * *", name="five-minutely", args=["x"], queue="digests")(
        send_digest
    )
    assert decorated is send_digest
    (spec,) = declarations.declared()
    assert json.loads(spec.submission.payload_json)["task"] == send_digest.module_path
    assert spec.submission.queue == "digests"  # periodic's own options win


def test_the_same_declaration_twice_is_one_schedule():
    first = periodic("@daily", name="twice", handler="x.y")
    again = periodic("@daily", name="twice", handler="x.y")
    assert first == again
    assert [s.name for s in declarations.declared()] == ["twice"]


def test_a_zoneinfo_object_is_accepted_as_the_zone():
    spec = periodic("0 6 * * *", name="zoned", handler="x.y", timezone=ZoneInfo("Asia/Tokyo"))
    assert spec.timezone == "Asia/Tokyo"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "0 6 * *"}, "five fields"),
        ({"cron": "0 6 * * *", "timezone": "Europe/Pariss"}, "unknown time zone"),
        ({"cron": "0 6 * * *", "every": timedelta(hours=1)}, "not both"),
        ({}, "give a cron expression"),
        ({"cron": timedelta(hours=1), "every": timedelta(hours=1)}, "once"),
        ({"every": timedelta(hours=1), "timezone": "Europe/Paris"}, "cron expressions only"),
        ({"every": timedelta(milliseconds=10)}, "whole number of seconds"),
        ({"cron": "@daily", "catch_up": "some"}, "catch_up must be one of"),
        ({"cron": "@daily", "payload": {"when": object()}}, "not JSON"),
        ({"cron": "@daily", "payload": float("nan")}, "NaN"),
        ({"cron": "@daily", "name": "has space"}, "schedule name"),
        ({"cron": "@daily", "name": "a@b"}, "schedule name"),
        ({"cron": "@daily", "name": "x" * 101}, "at most 100"),
        ({"cron": "@daily", "queue": "bad queue"}, "queue"),
        ({"cron": "@daily", "max_attempts": 0}, "max_attempts"),
        ({"cron": "@daily", "args": [1]}, "task's arguments"),
        ({"cron": "@daily", "handler": 42}, "handler name or a @task"),
    ],
)
def test_bad_declarations_raise_invalid_schedule_and_declare_nothing(kwargs, message):
    arguments = {"name": "bad", "handler": "x.y", **kwargs}
    cron = arguments.pop("cron", None)
    with pytest.raises(InvalidSchedule, match=message) as raised:
        periodic(cron, **arguments)
    assert isinstance(raised.value, JobsConfigurationError)
    assert isinstance(raised.value, JobsError)
    assert declarations.declared() == []


def test_a_duplicate_name_is_refused():
    periodic("@daily", name="report", handler="x.y")
    with pytest.raises(InvalidSchedule, match="already declared"):
        periodic("@hourly", name="report", handler="x.y")
    (spec,) = declarations.declared()
    assert spec.cron == "0 0 * * *"  # the first declaration stands


def test_a_duplicate_name_is_refused_for_decorated_handlers_too():
    periodic("@daily", name="report", handler="x.y")
    with pytest.raises(InvalidSchedule, match="already declared"):

        @periodic("@hourly", name="report")
        @job_handler("reports.other")
        def other(ctx: JobContext) -> None:
            return None


def test_task_options_that_belong_to_handlers_are_refused():
    with pytest.raises(InvalidSchedule, match="args= and kwargs="):
        periodic("@daily", name="t1", handler=send_digest, payload={"a": 1})
    with pytest.raises(InvalidSchedule, match="version"):
        periodic("@daily", name="t2", handler=send_digest, version=2)
    with pytest.raises(InvalidSchedule, match="must be JSON"):
        periodic("@daily", name="t3", handler=send_digest, args=[object()])


def test_without_the_cron_extra_a_cron_schedule_is_refused_and_an_interval_is_not(monkeypatch):
    """cronsim is the ``[cron]`` extra: without it, a cron declaration says what to
    install; an interval needs nothing more."""
    import sys

    monkeypatch.setitem(sys.modules, "cronsim", None)  # as if not installed

    @job_handler("reports.needs-cron")
    def needs_cron(ctx: JobContext) -> None:
        return None

    with pytest.raises(InvalidSchedule, match=r"django-ledon\[cron\]"):
        periodic("0 6 * * *", name="needs-cron", handler="reports.needs-cron")
    periodic(every=timedelta(minutes=5), name="no-cron-needed", handler="reports.needs-cron")
    assert [s.name for s in declarations.declared()] == ["no-cron-needed"]
