"""Every cancel lands: a run whose cancel is requested while a worker advances it ends
Cancelled, whatever the advance was doing when the cancel committed, and its children
and items are cancelled with it. Never Running for ever with its driver gone, never
Waiting with a cancel nobody acts on.

Each race is forced, not hoped for: the cancel runs in another thread with its own
connection at a named fault point of the advance (the checkpoint reached, its cancel
check passed; the advance about to wait), and the advance goes on once it committed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from django.utils import timezone

from jobs.models import Job
from jobs.types import JobStatus
from testproject.workflow_checks import tasks as checks
from testproject.workflow_checks.models import Effect
from tests.conftest import in_own_connection, wait_until_blocked_on_lock
from tests.support.workflows import elsewhere_at
from workflows import (
    CancelOutcome,
    RunStatus,
    StepStatus,
    WorkflowContext,
    WorkflowScope,
    send_signal,
    start_workflow,
    store,
    workflow,
)
from workflows.models import WorkflowRun
from workflows.testing import TestClock, run_workflows_inline
from workflows.types import Wait, WaitKind

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-cancel-lands"
REACHED = "workflows.checkpoint.reached"


def pk(run_id: str) -> int:
    return WorkflowRun.objects.get(run_id=run_id).pk


def cancel(run_id: str) -> Any:
    return lambda: WorkflowScope(SCOPE).cancel(run_id)


def assert_cancelled(run_id: str) -> None:
    """The run ended Cancelled, no driver holds it, and none of its checkpoints or
    children is left open."""
    row = WorkflowRun.objects.get(run_id=run_id)
    assert (row.status, row.driver_token, row.finished_at is not None) == (
        RunStatus.CANCELLED,
        None,
        True,
    ), row.__dict__
    snap = WorkflowScope(SCOPE).get(run_id)
    assert snap.error == "cancelled on request"
    open_steps = [s.key for s in snap.steps if s.status in (StepStatus.RUNNING, StepStatus.WAITING)]
    assert open_steps == []
    children = WorkflowRun.objects.filter(parent=row).exclude(status=RunStatus.SUCCEEDED)
    assert {child.status for child in children} <= {RunStatus.CANCELLED}


def test_a_cancel_between_the_check_and_a_firing_timer_lands():
    start_workflow(SCOPE, "timer", "checks.sleeper", {"seconds": 60})
    clock = TestClock()
    run_workflows_inline(clock=clock)
    assert WorkflowScope(SCOPE).get("timer").waiting_for.startswith("timer until")
    clock.advance(61)
    with elsewhere_at(REACHED, cancel("timer"), key="nap", run=pk("timer")) as outcome:
        run_workflows_inline(clock=clock)
    assert outcome == [CancelOutcome.REQUESTED]
    assert_cancelled("timer")
    assert WorkflowScope(SCOPE).get("timer").step("nap").status == StepStatus.CANCELLED
    assert not Effect.objects.filter(key="after").exists()


def test_a_cancel_between_the_check_and_an_arriving_signal_lands():
    start_workflow(SCOPE, "signal", "checks.signals", {})
    run_workflows_inline()
    send_signal(SCOPE, "signal", "approved", {"by": "ops"})
    with elsewhere_at(REACHED, cancel("signal"), key="approved") as outcome:
        run_workflows_inline()
    assert outcome == [CancelOutcome.REQUESTED]
    assert_cancelled("signal")
    assert not Effect.objects.filter(key="after").exists()


def test_a_cancel_between_the_check_and_an_ended_child_lands():
    start_workflow(SCOPE, "parent", "checks.parent", {})
    # Reached first when the child is started, again once it has ended.
    with elsewhere_at(REACHED, cancel("parent"), key="kid", run=pk("parent"), times=2) as outcome:
        run_workflows_inline()
    assert outcome == [CancelOutcome.REQUESTED]
    assert_cancelled("parent")
    assert WorkflowScope(SCOPE).get("parent/kid").status == RunStatus.SUCCEEDED


def test_a_cancel_between_the_check_and_a_fan_in_lands():
    start_workflow(SCOPE, "fan", "checks.fanout", {"items": [1, 2]})
    # Reached first when the items are staged, again once the last one has ended.
    with elsewhere_at(REACHED, cancel("fan"), key="double", times=2) as outcome:
        run_workflows_inline()
    assert outcome == [CancelOutcome.REQUESTED]
    assert_cancelled("fan")
    assert not Effect.objects.filter(key="total").exists()


def test_a_cancel_before_the_second_try_of_an_inline_step_lands():
    start_workflow(SCOPE, "retry", "checks.flaky", {"fail_times": 1, "retries": 2})
    clock = TestClock()
    run_workflows_inline(clock=clock)
    assert WorkflowScope(SCOPE).get("retry").waiting_for.startswith("retry of flaky")
    clock.advance(60)
    with elsewhere_at(REACHED, cancel("retry"), key="flaky", times=1) as outcome:
        run_workflows_inline(clock=clock)
    assert outcome == [CancelOutcome.REQUESTED]
    assert_cancelled("retry")
    # The second try ran, and rolled back with the checkpoint it could not record.
    assert checks.TRIES[("retry", "flaky")] == 2
    assert not Effect.objects.exists()


#: Runs whose inline step "work" cancels its own run from another connection on its
#: second try, while that try's transaction is open.
CANCEL_ON_SECOND_TRY: dict[str, int] = {}


def work(run_id: str) -> str:
    checks.write_effect(run_id, "work", 1)
    CANCEL_ON_SECOND_TRY[run_id] += 1
    if CANCEL_ON_SECOND_TRY[run_id] == 1:
        raise ConnectionError("first try fails")
    with ThreadPoolExecutor(max_workers=1) as pool:
        outcome = pool.submit(in_own_connection(cancel(run_id))).result(timeout=30)
    assert outcome == CancelOutcome.REQUESTED
    return "done"


@workflow("cancellands.retrying", version=1)
def retrying(wf: WorkflowContext) -> Any:
    wf.step("work", work, wf.run_id, retries=2)
    wf.step("after", checks.write_effect, wf.run_id, "after", 1)
    return "unreachable"


@pytest.mark.postgres_only
def test_a_cancel_committed_during_a_retried_inline_step_lands():
    # Real timing: the step's try holds no lock on the run (its fence comes last), so
    # on PostgreSQL a cancel commits while the try runs. (SQLite's one write lock
    # makes that cancel wait for the try's commit instead.)
    CANCEL_ON_SECOND_TRY["real"] = 0
    start_workflow(SCOPE, "real", "cancellands.retrying")
    clock = TestClock()
    run_workflows_inline(clock=clock)
    clock.advance(60)
    run_workflows_inline(clock=clock)
    assert CANCEL_ON_SECOND_TRY["real"] == 2
    assert_cancelled("real")
    assert not Effect.objects.exists()


@pytest.mark.parametrize(
    ("point", "match"),
    [(REACHED, {"key": "approved"}), ("workflows.advance.suspend", {})],
    ids=["at-the-wait", "before-suspending"],
)
def test_a_cancel_just_before_the_run_waits_lands(point, match):
    start_workflow(SCOPE, "waits", "checks.signals", {})
    with elsewhere_at(point, cancel("waits"), run=pk("waits"), **match) as outcome:
        run_workflows_inline()
    assert outcome == [CancelOutcome.REQUESTED]
    assert_cancelled("waits")


def test_a_cancel_just_before_a_child_starts_cancels_the_child():
    start_workflow(SCOPE, "parent-2", "checks.parent", {"child": "checks.signals"})
    with elsewhere_at(REACHED, cancel("parent-2"), key="kid", run=pk("parent-2")) as outcome:
        run_workflows_inline()
    assert outcome == [CancelOutcome.REQUESTED]
    assert_cancelled("parent-2")
    assert WorkflowScope(SCOPE).get("parent-2/kid").status == RunStatus.CANCELLED


def test_a_cancel_just_before_items_are_staged_cancels_their_jobs():
    start_workflow(SCOPE, "fan-2", "checks.fanout", {"items": [1, 2, 3]})
    with elsewhere_at(REACHED, cancel("fan-2"), key="double") as outcome:
        run_workflows_inline()
    assert outcome == [CancelOutcome.REQUESTED]
    assert_cancelled("fan-2")
    items = Job.objects.filter(handler="checks.double")
    assert list(items.values_list("status", flat=True)) == [JobStatus.CANCELLED] * 3
    assert not Effect.objects.filter(kind="activity").exists()


class WhileBlocked:
    """Runs a store call in a thread of its own, and waits until it either ended or
    waits for a lock another transaction holds (PostgreSQL)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.started: list[Future[Any]] = []

    def start(self, fn: Callable[[], Any]) -> Callable[[], None]:
        def action() -> None:
            self.started.append(self.pool.submit(in_own_connection(fn)))
            while not self.started[0].done():
                try:
                    wait_until_blocked_on_lock(timeout=0.2)
                    return
                except AssertionError:
                    continue

        return action

    def result(self) -> Any:
        return self.started[0].result(timeout=30)


@pytest.fixture
def while_blocked() -> Iterator[WhileBlocked]:
    helper = WhileBlocked()
    yield helper
    helper.pool.shutdown()


@pytest.mark.postgres_only
@pytest.mark.parametrize(
    ("point", "call", "answer", "suspended"),
    [
        # A second advance job finds the run Running and is refused; the driver
        # suspends between that refusal and its note of a wake-up. The note must not
        # fall on a run already Waiting: the driver has to see it and replay.
        (
            "workflows.take.refused",
            lambda: store.take(pk("both"), "job-b"),
            None,
            store.Suspended.WAKE_PENDING,
        ),
        # The cancel finds the run still Running after its first statement, and the
        # driver suspends before its second: the cancel must not answer "already
        # finished" for a run that waits on, and the driver must end the run.
        (
            "workflows.cancel.not_waiting",
            cancel("both"),
            CancelOutcome.REQUESTED,
            store.Suspended.CANCEL_REQUESTED,
        ),
    ],
    ids=["take", "cancel"],
)
def test_a_driver_suspending_between_two_statements_loses_nothing(
    while_blocked, point, call, answer, suspended
):
    start_workflow(SCOPE, "both", "checks.signals", {})
    driver = store.take(pk("both"), "job-a")
    assert driver is not None
    suspend = while_blocked.start(
        lambda: store.suspend(driver, Wait(kind=WaitKind.SIGNAL, key="approved"), timezone.now())
    )
    with elsewhere_at(point, suspend, run=pk("both")):
        assert while_blocked.pool.submit(in_own_connection(call)).result(timeout=30) == answer
    # The suspend ran once the other transaction ended, and saw what it wrote.
    assert while_blocked.result() is suspended
    assert WorkflowRun.objects.get(run_id="both").status == RunStatus.RUNNING


def test_a_resumed_parent_of_a_cancelled_child_fails_again_instead_of_waiting():
    start_workflow(SCOPE, "orphan", "checks.parent", {"child": "checks.signals"})
    run_workflows_inline()
    assert WorkflowScope(SCOPE).cancel("orphan/kid") == CancelOutcome.CANCELLED
    run_workflows_inline()
    assert WorkflowScope(SCOPE).get("orphan").status == RunStatus.FAILED
    WorkflowScope(SCOPE).resume("orphan")
    run_workflows_inline()
    # The child it finds again ended long ago: nothing would ever wake it for that.
    snap = WorkflowScope(SCOPE).get("orphan")
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "kid"
    assert snap.error.startswith("StepFailed: step 'kid' failed: ChildRunCancelled")
