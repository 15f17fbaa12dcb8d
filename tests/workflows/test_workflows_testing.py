"""``workflows.testing``: what a user's test gets from running workflows inline."""

from __future__ import annotations

from datetime import timedelta

import pytest

from workflows import RunStatus, send_signal, start_workflow
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
