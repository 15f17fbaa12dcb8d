"""``manage.py jobs_queues list|pause|resume NAME``: each queue's depth, Running
jobs, pause and limits; pausing and resuming for every worker; bad input refused
with nothing changed."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from jobs import JobScope, JobSubmission, execution, submit_job
from jobs.models import Queue

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "queues-command"


def run(*args: str) -> list[str]:
    out = StringIO()
    call_command("jobs_queues", *args, stdout=out)
    return out.getvalue().splitlines()


def test_list_shows_depth_running_paused_and_limits(settings):
    settings.JOBS = {
        "QUEUES": {"emails": {"max_running": 4, "rate": (10, 1)}, "quiet": {"fair": False}}
    }
    for n in range(3):
        submit_job(SCOPE, f"m{n}", JobSubmission.create("test.record", {}, queue="emails"))
    submit_job(SCOPE, "d", JobSubmission.create("test.record", {}))
    assert len(execution.claim_due("w", limit=1, queues=["emails"])) == 1
    assert execution.pause_queue("reports")
    lines = run("list")
    assert lines[0].split() == ["queue", "queued", "running", "paused", "order", "limits"]
    rows = {line.split()[0]: line.split(None, 5)[1:] for line in lines[1:]}
    assert rows == {
        "default": ["1", "0", "no", "fair", "none"],
        "emails": ["2", "1", "no", "fair", "max_running=4, rate=10/1s"],
        "quiet": ["0", "0", "no", "submission", "none"],
        "reports": ["0", "0", "yes", "fair", "none"],
    }


def test_scopes_show_each_scope_weight_and_jobs(settings):
    execution.set_scope_weight("tenant-heavy", 2.5)
    for n in range(3):
        submit_job("tenant-heavy", f"h{n}", JobSubmission.create("test.record", {}))
    submit_job(SCOPE, "m", JobSubmission.create("test.record", {}, queue="emails"))
    assert len(execution.claim_due("w", limit=1, queues=["default"])) == 1
    lines = run("scopes")
    assert lines[0].split() == ["queue", "scope", "weight", "queued", "running"]
    rows = [line.split() for line in lines[1:]]
    assert rows == [
        ["default", JobScope("tenant-heavy").scope_hash, "2.5", "2", "1"],
        ["emails", JobScope(SCOPE).scope_hash, "1", "1", "0"],
    ]
    assert [
        row[0] for row in (line.split() for line in run("scopes", "--queue", "emails")[1:])
    ] == ["emails"]


def test_list_with_no_queue_says_so():
    assert run("list") == ["No queue has jobs, a stored state or limits."]


def test_pause_and_resume_stop_and_restart_claims():
    submit_job(SCOPE, "m", JobSubmission.create("test.record", {}, queue="emails"))
    assert run("pause", "emails") == [
        "queue emails paused: no worker claims its jobs until 'jobs_queues resume'"
    ]
    assert run("pause", "emails") == ["queue emails was already paused"]
    assert execution.claim_due("w", limit=5) == []
    assert run("resume", "emails") == ["queue emails resumed"]
    assert run("resume", "emails") == ["queue emails was not paused"]
    assert [c.job_id for c in execution.claim_due("w", limit=5)] == ["m"]


@pytest.mark.parametrize("name", ["", "bad queue", "x" * 101])
def test_a_bad_queue_name_is_a_command_error_and_changes_nothing(name):
    with pytest.raises(CommandError, match="queue"):
        run("pause", name)
    with pytest.raises(CommandError, match="queue"):
        run("resume", name)
    assert not Queue.objects.exists()


def test_an_unknown_action_is_refused():
    with pytest.raises(CommandError):
        run("drain", "emails")
    assert not Queue.objects.exists()
