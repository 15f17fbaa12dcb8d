"""Run deadlines: a run not finished ``timeout`` seconds after its creation ends
Cancelled with ``RunTimedOut``, whatever it waits for, its unfinished children and
activity jobs with it; the wake-up that does it is a job staged with the run. The
clock is a test clock: nothing waits for real time."""

from __future__ import annotations

import math

import pytest

from jobs.models import Job
from jobs.types import JobStatus
from testproject.workflow_checks import tasks as checks
from workflows import RunStatus, StepStatus, WorkflowScope, send_signal, start_workflow, store
from workflows.engine import advance
from workflows.exceptions import InvalidInput, InvalidWorkflow
from workflows.models import WorkflowRun
from workflows.registry import find_workflow, unregister_workflow, workflow
from workflows.testing import TestClock, run_workflow, run_workflows_inline, use_clock

pytestmark = pytest.mark.django_db

SCOPE = "tenant-deadlines"


def deadline_jobs(run_id: str) -> dict[str, str]:
    pk = WorkflowRun.objects.get(run_id=run_id).pk
    jobs = Job.objects.filter(job_id__startswith=f"wf:{pk}.", job_id__contains=":deadline")
    return dict(jobs.values_list("job_id", "status"))


def test_a_run_waiting_on_a_signal_times_out_with_its_child_and_activity():
    snap = start_workflow(SCOPE, "late-1", "checks.deadline")
    clock = TestClock(snap.created_at)
    run_workflows_inline(clock=clock)
    assert WorkflowScope(SCOPE).get("late-1").waiting_for == "signal approved"
    assert WorkflowScope(SCOPE).get("late-1/kid").status == RunStatus.WAITING
    clock.advance(3599)  # not yet: the deadline's job is not due
    run_workflows_inline(clock=clock)
    assert WorkflowScope(SCOPE).get("late-1").status == RunStatus.WAITING
    clock.advance(1)
    run_workflows_inline(clock=clock)
    late = WorkflowScope(SCOPE).get("late-1")
    assert late.status == RunStatus.CANCELLED
    assert late.error.startswith("RunTimedOut: run 'late-1' did not finish by its deadline"), (
        late.error
    )
    assert late.step("approved").status == StepStatus.CANCELLED
    kid = WorkflowScope(SCOPE).get("late-1/kid")
    assert kid.status == RunStatus.CANCELLED
    assert list(deadline_jobs("late-1").values()) == [JobStatus.SUCCEEDED]


def test_the_deadline_cancels_the_activity_job_the_run_waits_for():
    clock = TestClock(start_workflow(SCOPE, "late-2", "checks.deadline", timeout=60).created_at)
    run_workflows_inline(clock=clock, max_attempts_run=1)  # the first advance only
    assert Job.objects.get(handler="checks.price").status == JobStatus.QUEUED
    clock.advance(61)
    with use_clock(clock):
        # The deadline's job, run by hand before the activity's job.
        assert advance(WorkflowRun.objects.get(run_id="late-2").pk) == "cancelled"
    assert WorkflowScope(SCOPE).get("late-2").error.startswith("RunTimedOut:")
    assert Job.objects.get(handler="checks.price").status == JobStatus.CANCELLED
    assert WorkflowScope(SCOPE).get("late-2/kid").status == RunStatus.CANCELLED


def test_a_running_run_is_asked_to_stop_and_its_driver_ends_it_timed_out():
    clock = TestClock(start_workflow(SCOPE, "late-3", "checks.deadline", timeout=60).created_at)
    run_workflows_inline(clock=clock)
    run = WorkflowRun.objects.get(run_id="late-3")
    driver = store.take(run.pk)  # a driver in the middle of an advance
    assert driver is not None
    clock.advance(61)
    run_workflows_inline(clock=clock)  # the deadline's job finds the run Running
    running = WorkflowScope(SCOPE).get("late-3")
    assert running.status == RunStatus.RUNNING
    assert running.cancel_requested  # what an inline step sees as wf.cancel_requested
    assert WorkflowScope(SCOPE).get("late-3/kid").status == RunStatus.CANCELLED
    with use_clock(clock):
        assert advance(run.pk) == "cancelled"  # the driver's next advance
    assert WorkflowScope(SCOPE).get("late-3").error.startswith("RunTimedOut:")


def test_the_start_timeout_wins_and_none_means_the_declared_one():
    short = start_workflow(SCOPE, "late-4", "checks.deadline", timeout=30)
    declared = start_workflow(SCOPE, "late-5", "checks.deadline", timeout=None)
    clock = TestClock(declared.created_at)
    run_workflows_inline(clock=clock)
    clock.advance(31)
    run_workflows_inline(clock=clock)
    assert WorkflowScope(SCOPE).get("late-4").status == RunStatus.CANCELLED
    assert WorkflowScope(SCOPE).get("late-5").status == RunStatus.WAITING
    deadlines = dict(WorkflowRun.objects.values_list("run_id", "deadline"))
    assert (deadlines["late-4"] - short.created_at).total_seconds() == 30
    assert (deadlines["late-5"] - declared.created_at).total_seconds() == 3600
    # A child takes its own workflow's declared timeout: "checks.ship" has none.
    assert deadlines["late-4/kid"] is None


def test_a_run_finished_in_time_drops_its_deadline_job():
    start_workflow(SCOPE, "quick", "checks.deadline")
    run_workflows_inline()
    send_signal(SCOPE, "quick/kid", "go", 1)
    send_signal(SCOPE, "quick", "approved")
    done = run_workflow(SCOPE, "quick")
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert done.output == [{"shipped": 1}, 30]
    assert list(deadline_jobs("quick").values()) == [JobStatus.CANCELLED]


def test_a_resumed_run_keeps_its_deadline():
    checks.FAILING.add(2)
    try:
        start_workflow(SCOPE, "late-6", "checks.resumable", timeout=600)
        assert run_workflow(SCOPE, "late-6").status == RunStatus.FAILED
        assert list(deadline_jobs("late-6").values()) == [JobStatus.CANCELLED]
        WorkflowScope(SCOPE).resume("late-6")
        jobs = deadline_jobs("late-6")
        assert sorted(jobs.values()) == [JobStatus.CANCELLED, JobStatus.QUEUED]
        clock = TestClock()
        clock.advance(600)
        run_workflows_inline(clock=clock)
        late = WorkflowScope(SCOPE).get("late-6")
        assert late.status == RunStatus.CANCELLED
        assert late.error.startswith("RunTimedOut:")
    finally:
        checks.FAILING.discard(2)


@pytest.mark.parametrize("timeout", [0, -1, "60", math.nan, math.inf, True, 10**10])
def test_a_timeout_that_is_not_a_positive_number_is_refused_and_writes_nothing(timeout):
    with pytest.raises(InvalidInput, match="timeout must be a number of seconds"):
        start_workflow(SCOPE, "bad-timeout", "checks.deadline", timeout=timeout)
    assert not WorkflowRun.objects.exists()
    assert not Job.objects.exists()


@pytest.mark.parametrize("timeout", [0, -5, "1h", math.nan])
def test_a_declared_timeout_that_is_not_a_positive_number_is_refused(timeout):
    with pytest.raises(InvalidWorkflow, match=r"'checks\.bad_deadline': timeout must be"):
        workflow("checks.bad_deadline", version=1, timeout=timeout)(lambda wf: None)
    assert find_workflow("checks.bad_deadline", 1) is None


def test_a_run_of_a_version_this_worker_lacks_still_times_out():
    @workflow("checks.gone", version=1, timeout=60)
    def gone(wf):
        return wf.wait_for_signal("never")

    try:
        snap = start_workflow(SCOPE, "gone-1", "checks.gone")
    finally:
        unregister_workflow("checks.gone", 1)  # a worker deployed without it
    clock = TestClock(snap.created_at)
    clock.advance(60)
    with use_clock(clock):
        assert advance(WorkflowRun.objects.get(run_id="gone-1").pk) == "cancelled"
    assert WorkflowScope(SCOPE).get("gone-1").error.startswith("RunTimedOut:")
