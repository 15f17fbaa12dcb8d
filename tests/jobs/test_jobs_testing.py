"""jobs.testing: running jobs inline inside an ordinary (transactional) test."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import JobScope, JobStatus, JobSubmission, job_handler, submit_job
from jobs.handlers import RetryPolicy, unregister
from jobs.testing import run_jobs_inline
from jobs.types import FinishOutcome

pytestmark = pytest.mark.django_db  # the test's own transaction: nothing commits

SCOPE = "inline"


@pytest.fixture(autouse=True)
def handlers():
    @job_handler("inline.ok")
    def ok(ctx):
        ctx.report_progress(100, "done")
        return f"ok {ctx.payload['n']}"

    @job_handler("inline.async")
    async def run_async(ctx):
        return "async ok"

    @job_handler("inline.flaky", retry=RetryPolicy(base_delay=60, jitter=0))
    def flaky(ctx):
        if ctx.attempt == 1:
            raise ConnectionError("first attempt fails")
        return "second time lucky"

    yield
    for name in ("inline.ok", "inline.async", "inline.flaky"):
        unregister(name, 1)


def test_runs_due_jobs_in_the_tests_transaction():
    submit_job(SCOPE, "a", JobSubmission.create("inline.ok", {"n": 1}))
    submit_job(SCOPE, "b", JobSubmission.create("inline.async"))
    submit_job(SCOPE, "ghost", JobSubmission.create("inline.missing"))
    runs = run_jobs_inline()
    assert {(r.job_id, r.outcome) for r in runs} == {
        ("a", FinishOutcome.SUCCEEDED),
        ("b", FinishOutcome.SUCCEEDED),
        ("ghost", FinishOutcome.PUT_BACK),  # perhaps a newer worker knows it
    }
    assert JobScope(SCOPE).get("a").result_ref == "ok 1"
    assert JobScope(SCOPE).get("a").progress == 100
    assert JobScope(SCOPE).get("b").result_ref == "async ok"
    assert "'inline.missing' version 1" in JobScope(SCOPE).get("ghost").error
    assert run_jobs_inline() == []  # nothing left that is due


def test_retries_follow_the_handlers_policy_and_time_can_be_moved():
    submit_job(SCOPE, "f", JobSubmission.create("inline.flaky", max_attempts=2))
    (first,) = run_jobs_inline()
    assert first.outcome == FinishOutcome.REQUEUED
    assert "ConnectionError: first attempt fails" in first.error
    assert run_jobs_inline() == []  # the retry is due in 60 s
    (second,) = run_jobs_inline(now=timezone.now() + timedelta(seconds=61))
    assert (second.attempt, second.outcome) == (2, FinishOutcome.SUCCEEDED)
    assert JobScope(SCOPE).get("f").status == JobStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_fresh_process_finds_the_apps_handlers_without_importing_them(tmp_path):
    """docs/testing.md as a new user's test runs it: nothing has imported the apps'
    tasks modules yet, so run_jobs_inline() must, as a worker does."""
    from tests.support.procs import ManageProcess

    code = (
        "from jobs import JobSubmission, submit_job; "
        "from jobs.testing import run_jobs_inline; "
        "submit_job('fresh', 'r', JobSubmission.create('test.record', {})); "
        "print([(r.job_id, r.outcome.value, r.error) for r in run_jobs_inline()])"
    )
    shell = ManageProcess(tmp_path, "shell", "-c", code)
    assert shell.wait() == 0, shell.output
    assert "[('r', 'succeeded', '')]" in shell.output
    assert JobScope("fresh").get("r").result_ref == "recorded r"
