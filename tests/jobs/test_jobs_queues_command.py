"""``manage.py jobs_queues list|scopes|keys|why|pause|resume``: each queue's depth,
Running jobs, pause and limits; each scope's and limit key's state; why a job waits;
pausing and resuming for every worker; bad input refused with nothing changed."""

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


def test_keys_show_each_limit_key_against_its_cap_and_rate(handler, settings):
    handler("keyed.push", max_running_per_key=1, rate_per_key=(1, 60, 2))(lambda ctx: None)
    settings.JOBS = {"QUEUES": {"crm": {"max_running": 5}, "other": {"rate": (1, 1)}}}
    for n in range(3):
        submit_job(
            SCOPE, f"a{n}",
            JobSubmission.create("keyed.push", {}, queue="crm", limit_key="acct-a"),
        )  # fmt: skip
    submit_job(SCOPE, "b0", JobSubmission.create("keyed.push", {}, queue="crm", limit_key="b"))
    assert len(execution.claim_due("w", limit=10, queues=["crm"])) == 2
    lines = run("keys", "--queue", "crm")
    assert lines[0].split() == [
        "limit", "key", "queued", "running", "cap", "rate", "free", "next", "free",
    ]  # fmt: skip
    assert [line.split() for line in lines[1:]] == [
        ["handler:keyed.push", "acct-a", "2", "1", "1", "1/60sburst2", "1/2", "now"],
        ["handler:keyed.push", "b", "0", "1", "1", "1/60sburst2", "1/2", "now"],
        ["queue:crm", "*", "2", "2", "5", "-", "-", "-"],
    ]
    assert run("keys", "--queue", "other") == ["No limit has Queued or Running jobs."]
    with pytest.raises(CommandError, match="queue"):
        run("keys", "--queue", "bad queue")


def test_why_prints_each_reason_a_job_waits(handler, settings):
    handler("keyed.push", max_running_per_key=1)(lambda ctx: None)
    for n in range(2):
        submit_job(
            SCOPE, f"a{n}",
            JobSubmission.create("keyed.push", {}, queue="crm", limit_key="acct-a"),
        )  # fmt: skip
    assert len(execution.claim_due("w", limit=10, queues=["crm"])) == 1
    execution.pause_queue("crm")
    scope_hash = JobScope(SCOPE).scope_hash
    expected = [
        f"job a1 (scope {scope_hash}, queue crm, handler keyed.push): Queued",
        "  - its queue 'crm' is paused",
        "  - over handler 'keyed.push' max_running_per_key=1 for key 'acct-a': 1 running of 1",
    ]
    # By the scope's name, or by its hash.
    assert run("why", SCOPE, "a1") == expected
    assert run("why", scope_hash, "a1") == expected
    assert run("why", SCOPE, "a0")[1:] == []
    with pytest.raises(CommandError, match="no job 'missing'"):
        run("why", SCOPE, "missing")
