"""``workflows.testing``: what a user's test gets from running workflows inline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from workflows import RunStatus, WorkflowContext, send_signal, start_workflow, workflow
from workflows.exceptions import RunNotFound
from workflows.testing import TestClock, run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db

SCOPE = "tenant-testing"


def test_run_workflow_stops_at_a_wait_only_the_test_can_end_and_goes_on_after_it():
    start_workflow(SCOPE, "t-1", "checks.signals", {})
    waiting = run_workflow(SCOPE, "t-1")
    assert waiting.status == RunStatus.WAITING
    assert waiting.waiting_for == "signal approved"
    send_signal(SCOPE, "t-1", "approved", "yes")
    assert run_workflow(SCOPE, "t-1").output == "yes"


def test_the_clock_moves_only_as_far_as_the_next_timer():
    clock = TestClock()
    start = clock.now
    start_workflow(SCOPE, "t-2", "checks.sleeper", {"seconds": 7200})
    snap = run_workflow(SCOPE, "t-2", clock=clock)
    assert snap.status == RunStatus.SUCCEEDED
    nap = snap.step("nap")
    assert nap.wake_at is not None
    assert clock.now == nap.wake_at
    assert timedelta(hours=2) <= clock.now - start < timedelta(hours=2, seconds=5)


def test_run_workflows_inline_runs_only_what_is_due_at_the_clock():
    start_workflow(SCOPE, "t-3", "checks.sleeper", {"seconds": 60})
    clock = TestClock()
    ran = run_workflows_inline(clock=clock)
    assert [run.handler for run in ran] == ["workflows.advance"]
    assert run_workflows_inline(clock=clock) == []
    clock.advance(60)
    assert [run.handler for run in run_workflows_inline(clock=clock)] == ["workflows.advance"]


def test_run_workflow_of_an_unknown_run_is_run_not_found():
    with pytest.raises(RunNotFound):
        run_workflow(SCOPE, "nobody")


@workflow("testing.approval", version=1)
def approval(wf: WorkflowContext) -> Any:
    return wf.wait_for_signal("approved", timeout=86_400)


@workflow("testing.parent_of_approval", version=1)
def parent_of_approval(wf: WorkflowContext) -> Any:
    return wf.child("kid", "testing.approval")


def test_run_workflow_stops_at_a_signal_wait_with_a_timeout():
    start_workflow(SCOPE, "t-4", "testing.approval")
    clock = TestClock()
    start = clock.now
    waiting = run_workflow(SCOPE, "t-4", clock=clock)
    assert waiting.status == RunStatus.WAITING
    assert clock.now == start  # the clock was not moved to the wait's timeout
    send_signal(SCOPE, "t-4", "approved", "yes")
    assert run_workflow(SCOPE, "t-4", clock=clock).output == "yes"


def test_run_workflow_stops_at_a_child_runs_signal_wait_with_a_timeout():
    start_workflow(SCOPE, "t-5", "testing.parent_of_approval")
    clock = TestClock()
    assert run_workflow(SCOPE, "t-5", clock=clock).status == RunStatus.WAITING
    send_signal(SCOPE, "t-5/kid", "approved", "kid says yes")
    assert run_workflow(SCOPE, "t-5", clock=clock).output == "kid says yes"


def test_a_test_moves_the_clock_past_a_signal_waits_timeout_to_test_it():
    start_workflow(SCOPE, "t-6", "testing.approval")
    clock = TestClock()
    run_workflow(SCOPE, "t-6", clock=clock)
    clock.advance(86_400)
    failed = run_workflow(SCOPE, "t-6", clock=clock)
    assert failed.status == RunStatus.FAILED
    assert failed.error.startswith("SignalTimeout: no signal 'approved' arrived")
