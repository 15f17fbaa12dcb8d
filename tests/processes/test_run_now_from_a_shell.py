"""``jobs.schedules.run_now(name)`` works from a fresh process that imported none of
the apps' tasks modules (a shell, a view), as the admin's Run now does."""

from __future__ import annotations

import pytest

from jobs import execution
from tests.support.procs import database_url, manage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_run_now_from_a_shell_declares_the_schedules_first() -> None:
    code = "from jobs.schedules import run_now; print(run_now('demo-heartbeat').job_id)"
    manage(database_url(), "shell", "-c", code, env={"TIMETABLE": "demo"}, real=True)
    jobs = execution.reserved_scope("periodic").list()
    assert [job.job_id.split("@")[0] for job in jobs] == ["demo-heartbeat"]
    assert jobs[0].job_id.startswith("demo-heartbeat@manual-")
