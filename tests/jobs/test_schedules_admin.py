"""Schedules for operators: the schedules' admin (next run, last run's job linked with its
status, orphaned schedules, the pause / resume / run-now actions guarded by the
permission) and ``manage.py list_schedules``."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs import execution, periodic
from jobs.models import Job
from jobs.schedules import declarations, service
from tests.jobs import test_jobs_admin
from tests.support.schedules import period_jobs, row, schedules  # noqa: F401  (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("schedules")]

CHANGELIST = "admin:jobs_schedule_changelist"

staff_clients = test_jobs_admin.staff_client  # a fixture: staff with given permissions


@pytest.fixture
def declared(request: pytest.FixtureRequest) -> None:
    """Two schedules stored with a run each, and one that is no longer declared."""
    request.getfixturevalue("schedules")  # isolate first, then declare
    periodic("*/5 * * * *", name="every-five", handler="reports.five", timezone="Europe/Paris")
    periodic(timedelta(hours=1), name="hourly", handler="reports.hourly")
    periodic("@daily", name="gone", handler="reports.gone")
    now = timezone.now()
    execution.enqueue_due_schedules(now=now - timedelta(hours=2))
    # "gone" is stored, then no longer declared before its first run is due (a daily
    # run falls between the two passes when the clock reads 00:00 to 02:00).
    declarations.unregister("gone")
    execution.enqueue_due_schedules(now=now)


def act(client: Client, action: str, *names: str) -> list[str]:
    response = client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [row(n).pk for n in names]},
        follow=True,  # the list page shows (and so consumes) the action's messages
    )
    assert response.redirect_chain[0][1] == 302
    return [str(m) for m in response.context["messages"]]


@pytest.mark.usefixtures("declared")
def test_the_list_shows_timetable_next_run_last_job_linked_and_orphans(admin_client: Client):
    content = admin_client.get(reverse(CHANGELIST)).content.decode()
    hourly = row("hourly")
    job = Job.objects.get(job_id=hourly.last_job_id)
    assert f'href="{reverse("admin:jobs_job_change", args=[job.pk])}"' in content
    assert hourly.last_job_id in content
    assert "Queued" in content  # the last run's status
    assert "Every fifth minute of every hour (Europe/Paris)" in content
    assert "orphaned (no longer declared: never enqueued)" in content
    for action in ("Pause selected schedules", "Resume selected schedules", "Run selected"):
        assert action in content


@pytest.mark.usefixtures("declared")
def test_pause_resume_and_run_now_go_through_the_store(admin_client: Client):
    assert act(admin_client, "pause_schedules", "hourly") == ["1 paused, 0 already paused."]
    assert row("hourly").paused
    assert act(admin_client, "pause_schedules", "hourly") == ["0 paused, 1 already paused."]
    assert act(admin_client, "resume_schedules", "hourly") == ["1 resumed, 0 were not paused."]
    assert not row("hourly").paused
    before = set(period_jobs("hourly"))
    (message,) = act(admin_client, "run_schedules_now", "hourly")
    (manual,) = set(period_jobs("hourly")) - before
    assert manual.startswith("hourly@manual-")
    assert message == f"1 run started: {manual}."
    assert row("hourly").last_job_id == manual
    assert execution.reserved_scope("periodic").get(manual) is not None


@pytest.mark.usefixtures("declared")
def test_an_orphaned_schedule_cannot_be_run_now(admin_client: Client):
    messages = act(admin_client, "run_schedules_now", "gone")
    assert messages[0].startswith("Gone: no schedule named 'gone' is declared")
    assert messages[-1] == "0 run started."
    assert period_jobs("gone") == []


@pytest.mark.usefixtures("declared")
def test_staff_who_may_only_view_see_no_actions_and_cannot_post_them(staff_clients: Any):
    viewer = staff_clients("view_schedule")
    content = viewer.get(reverse(CHANGELIST)).content.decode()
    assert "hourly" in content
    assert "Pause selected schedules" not in content
    response = viewer.post(
        reverse(CHANGELIST), {"action": "pause_schedules", "_selected_action": [row("hourly").pk]}
    )
    assert response.status_code in (200, 302)
    assert not row("hourly").paused
    steerer = staff_clients("view_schedule", "change_schedule")
    assert act(steerer, "pause_schedules", "hourly") == ["1 paused, 0 already paused."]


@pytest.mark.usefixtures("declared")
def test_a_schedule_page_is_view_only(admin_client: Client):
    response = admin_client.get(reverse("admin:jobs_schedule_change", args=[row("hourly").pk]))
    content = response.content.decode()
    assert response.status_code == 200
    assert "View schedule" in content
    assert 'name="_save"' not in content


@pytest.mark.usefixtures("declared")
def test_list_schedules_prints_every_schedule_with_its_state():
    out = StringIO()
    call_command("list_schedules", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == [
        "name",
        "timetable",
        "next",
        "run",
        "(UTC)",
        "last",
        "run",
        "status",
        "state",
    ]
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert set(by_name) == {"every-five", "gone", "hourly"}
    assert by_name["gone"].endswith("orphaned")
    assert row("hourly").last_job_id in by_name["hourly"]
    assert "Queued" in by_name["hourly"]
    assert by_name["hourly"].endswith("active")


@pytest.mark.usefixtures("declared")
def test_list_schedules_json_says_paused_and_next_run():
    service.pause("every-five")
    out = StringIO()
    call_command("list_schedules", "--json", stdout=out)
    views = {v["name"]: v for v in map(json.loads, out.getvalue().splitlines())}
    assert views["every-five"]["state"] == "paused"
    assert views["every-five"]["paused"] is True
    assert views["every-five"]["next_run_at"] is None
    assert views["hourly"]["next_run_at"] == row("hourly").next_run_at.isoformat()
    assert views["gone"]["state"] == "orphaned"
    assert views["every-five"]["timezone"] == "Europe/Paris"


def test_list_schedules_shows_a_declared_schedule_not_stored_yet():
    periodic("@hourly", name="fresh", handler="reports.fresh")
    out = StringIO()
    call_command("list_schedules", stdout=out)
    (line,) = [line for line in out.getvalue().splitlines() if line.startswith("fresh")]
    assert line.endswith("not stored yet")
