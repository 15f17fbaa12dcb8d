"""``manage.py check`` flags a schedule whose handler is not registered (a misspelt
``@periodic(handler=...)``), with the name that was probably meant (``jobs.E004``)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from jobs import periodic
from jobs.schedules.checks import check_schedule_handlers
from tests.support.schedules import schedules  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("schedules")


def test_a_misspelt_handler_is_an_error_naming_the_one_meant(handler) -> None:
    handler("reports.daily")(lambda ctx: None)
    periodic("0 5 * * *", name="daily-report", handler="reports.dialy")
    [error] = check_schedule_handlers()
    assert error.id == "jobs.E004"
    assert "schedule 'daily-report' runs handler 'reports.dialy' version 1" in error.msg
    assert "Did you mean 'reports.daily'?" in error.hint


def test_a_version_that_is_not_registered_is_an_error(handler) -> None:
    handler("reports.daily")(lambda ctx: None)
    periodic("0 5 * * *", name="daily-report", handler="reports.daily", version=2)
    [error] = check_schedule_handlers()
    assert "version 2" in error.msg
    assert "registered versions: [1]" in error.msg


def test_schedules_of_registered_handlers_pass(handler) -> None:
    handler("reports.daily")(lambda ctx: None)
    periodic("0 5 * * *", name="daily-report", handler="reports.daily")
    assert check_schedule_handlers() == []


@pytest.mark.django_db
def test_manage_py_check_reports_it() -> None:
    periodic("0 5 * * *", name="orphan", handler="nobody.home")
    with pytest.raises(SystemCheckError, match=r"jobs\.E004"):
        call_command("check")
