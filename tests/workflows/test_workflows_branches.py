"""Branches side by side: ``wf.start`` (an activity) and ``wf.start_child`` (a child
run) stage their work in one advance and return handles; ``handle.result()`` and
``wf.gather`` wait for them without a slot. Driven inline, job by job, so that what
each advance staged can be looked at before anything else runs."""

from __future__ import annotations

from collections import Counter

import pytest

from jobs.models import Job
from jobs.types import JobStatus
from testproject.workflow_checks.branches import BRANCH_KEY, KEPT
from testproject.workflow_checks.models import Effect
from workflows import RunStatus, StepStatus, WorkflowScope, send_signal, start_workflow
from workflows.models import WorkflowRun, WorkflowStep
from workflows.store import ADVANCE_HANDLER
from workflows.testing import run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db

SCOPE = "tenant-branches"


def handlers_run(**kwargs: int) -> Counter[str]:
    return Counter(run.handler for run in run_workflows_inline(**kwargs))


def activity_effects(run_id: str) -> Counter[str]:
    return Counter(
        Effect.objects.filter(run_id=run_id, kind="activity").values_list("key", flat=True)
    )


def test_one_advance_starts_the_activity_and_the_child_before_waiting_for_either():
    start_workflow(SCOPE, "both-1", "checks.both", {"value": 4})
    assert handlers_run(max_attempts_run=1) == {ADVANCE_HANDLER: 1}  # the first advance
    # Both branches are staged by that one advance: the activity's job is queued and
    # the child run exists, neither has run yet.
    assert Job.objects.filter(handler="checks.price", status=JobStatus.QUEUED).count() == 1
    assert WorkflowScope(SCOPE).get("both-1/ship").status == RunStatus.WAITING
    parent = WorkflowScope(SCOPE).get("both-1")
    assert parent.status == RunStatus.WAITING
    assert [(s.key, s.kind, s.status) for s in parent.steps] == [
        ("price", "activity", StepStatus.RUNNING),
        ("ship", "child", StepStatus.WAITING),
    ]
    # Everything due runs: the activity ends while the child still waits for its signal.
    run_workflows_inline()
    assert activity_effects("both-1") == {"price-4": 1}
    parent = WorkflowScope(SCOPE).get("both-1")
    assert parent.status == RunStatus.WAITING
    assert parent.waiting_for == "child ship"
    assert parent.step("price").status == StepStatus.SUCCEEDED
    send_signal(SCOPE, "both-1/ship", "go", "courier-7")
    done = run_workflow(SCOPE, "both-1")
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert done.output == [40, {"shipped": "courier-7"}]
    assert activity_effects("both-1") == {"price-4": 1}  # never run again by a replay
    assert WorkflowRun.objects.filter(run_id__startswith="both-1/").count() == 1


@pytest.mark.parametrize("order", ["ship-first", "price-first"])
def test_result_waits_for_each_handle_whichever_is_awaited_first(order):
    run_id = f"res-{order}"
    start_workflow(SCOPE, run_id, "checks.both", {"value": 2, "await": order})
    run_workflows_inline()
    # Whatever the body awaits first, both branches were started by its first advance.
    assert activity_effects(run_id) == {"price-2": 1}
    assert WorkflowScope(SCOPE).get(f"{run_id}/ship").status == RunStatus.WAITING
    send_signal(SCOPE, f"{run_id}/ship", "go", 1)
    done = run_workflow(SCOPE, run_id)
    expected = [{"shipped": 1}, 20] if order == "ship-first" else [20, {"shipped": 1}]
    assert done.output == expected


def test_gather_fails_with_the_first_failed_handle_in_its_order_once_all_ended():
    order = ["ok", "child", "bad-b", "bad-a"]
    start_workflow(SCOPE, "fail-1", "checks.gather_failures", {"order": order})
    run_workflows_inline()
    # Both activities failed, the child still waits: the gather waits too.
    assert activity_effects("fail-1") == {"price-1": 1, "bad-a": 1, "bad-b": 1}
    waiting = WorkflowScope(SCOPE).get("fail-1")
    assert waiting.status == RunStatus.WAITING
    assert waiting.waiting_for == "child child"
    send_signal(SCOPE, "fail-1/child", "go")
    failed = run_workflow(SCOPE, "fail-1")
    assert failed.status == RunStatus.FAILED
    # "bad-b" comes before "bad-a" in the order given (and was started first).
    assert failed.failed_step == "bad-b"
    assert failed.error.startswith("StepFailed: step 'bad-b' failed: LookupError: no bad-b")
    assert {s.key: s.status for s in failed.steps} == {
        "ok": StepStatus.SUCCEEDED,
        "child": StepStatus.SUCCEEDED,
        "bad-b": StepStatus.FAILED,
        "bad-a": StepStatus.FAILED,
    }


def test_gather_names_the_first_failure_in_the_order_given_not_the_order_started():
    start_workflow(SCOPE, "fail-2", "checks.gather_failures", {"order": ["bad-z", "bad-y"]})
    assert run_workflow(SCOPE, "fail-2").failed_step == "bad-z"
    start_workflow(SCOPE, "fail-3", "checks.gather_failures", {"order": ["bad-y", "bad-z"]})
    assert run_workflow(SCOPE, "fail-3").failed_step == "bad-y"


def test_a_failed_child_fails_its_handle_with_step_failed():
    start_workflow(SCOPE, "cfail-1", "checks.both", {"child_fails": True})
    run_workflows_inline()
    send_signal(SCOPE, "cfail-1/ship", "go")
    snap = run_workflow(SCOPE, "cfail-1")
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "ship"
    assert snap.error.startswith("StepFailed: step 'ship' failed: RuntimeError: the courier")


def test_cancelling_a_run_cancels_its_started_branches():
    start_workflow(SCOPE, "can-b", "checks.both", {})
    run_workflows_inline(max_attempts_run=1)
    assert WorkflowScope(SCOPE).cancel("can-b") == "cancelled"
    assert WorkflowScope(SCOPE).get("can-b/ship").status == RunStatus.CANCELLED
    assert Job.objects.get(handler="checks.price").status == JobStatus.CANCELLED
    run_workflows_inline()
    assert activity_effects("can-b") == {}


def assert_failed_with(run_id: str, error: str) -> None:
    snap = run_workflow(SCOPE, run_id)
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith(error), snap.error


def steps_and_jobs(run_id: str) -> tuple[list[str], int]:
    run = WorkflowRun.objects.get(run_id=run_id)
    keys = list(WorkflowStep.objects.filter(run=run).order_by("id").values_list("key", flat=True))
    return keys, Job.objects.filter(handler="checks.price").count()


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("other-key", "InvalidHandle: gather(): the handle awaited under 'elsewhere'"),
        ("not-a-handle", "InvalidHandle: gather(): 'price' is no StepHandle"),
        ("twice", "NonDeterministicWorkflow: checkpoint 'price': used twice"),
    ],
)
def test_a_misused_handle_is_a_typed_error_that_writes_nothing(how, error):
    run_id = f"mis-{how}"
    start_workflow(SCOPE, run_id, "checks.misused_handle", {"how": how})
    assert_failed_with(run_id, error)
    # Only the first start wrote: its checkpoint and its one job.
    assert steps_and_jobs(run_id) == (["price"], 1)


def test_gather_of_a_handle_another_run_started_is_a_typed_error_that_writes_nothing():
    KEPT.clear()
    start_workflow(SCOPE, "keeper", "checks.misused_handle", {"how": "keep"})
    run_workflows_inline()
    start_workflow(SCOPE, "thief", "checks.misused_handle", {"how": "other-run"})
    assert_failed_with(
        "thief",
        "InvalidHandle: gather(): the handle of 'price' was started by run 'keeper', "
        "not this run ('thief')",
    )
    assert WorkflowStep.objects.filter(run__run_id="thief").count() == 0
    # The handle's own run is untouched.
    assert WorkflowScope(SCOPE).get("keeper").status == RunStatus.WAITING


def test_a_handle_kept_from_an_earlier_advance_of_the_same_run_is_refused():
    KEPT.clear()
    start_workflow(SCOPE, "stale", "checks.misused_handle", {"how": "stale"})
    run_workflows_inline()
    send_signal(SCOPE, "stale", "go")
    assert_failed_with(
        "stale",
        "InvalidHandle: result(): the handle of 'price' was started by an earlier advance "
        "of this run",
    )
    assert steps_and_jobs("stale") == (["price", "go"], 1)


def test_a_replay_that_starts_another_branch_than_the_one_recorded_fails_the_run():
    BRANCH_KEY["key"] = "a"
    try:
        start_workflow(SCOPE, "flip", "checks.flipping_branch")
        run_workflows_inline()
        BRANCH_KEY["key"] = "b"  # a deploy that renamed the branch
        send_signal(SCOPE, "flip", "go")
        assert_failed_with(
            "flip", "NonDeterministicWorkflow: checkpoint 'b': reached as a new checkpoint"
        )
    finally:
        BRANCH_KEY["key"] = "a"
    # The new branch was never started: one job, the recorded branch's.
    assert Job.objects.filter(handler="checks.price").count() == 1


def test_start_refuses_a_plain_function():
    @__import__("workflows").workflow("checks.start_plain", version=1)
    def start_plain(wf):
        return wf.start("plain", len, [1]).result()

    try:
        start_workflow(SCOPE, "plain-1", "checks.start_plain")
        snap = run_workflow(SCOPE, "plain-1")
        assert snap.status == RunStatus.FAILED
        assert snap.error.startswith("InvalidInput: start 'plain': 'len' is not an @activity")
        assert snap.failed_step == "plain"
        assert WorkflowStep.objects.filter(run__run_id="plain-1").count() == 0
    finally:
        __import__("workflows.registry").registry.unregister_workflow("checks.start_plain", 1)
