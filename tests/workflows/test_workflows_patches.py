"""``wf.patched(patch_id)``: a run that reaches the patch for the first time takes
the new path and records it; a run that had already passed that point under the older
body keeps the old path; both in one version, beside the order rule of a replay."""

from __future__ import annotations

from typing import Any

import pytest

from testproject.workflow_checks import tasks as checks
from testproject.workflow_checks.models import Effect
from workflows import RunStatus, WorkflowContext, WorkflowScope, start_workflow, workflow
from workflows.models import WorkflowStep
from workflows.testing import TestClock, run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-patches"

#: Which body is "deployed": "old" (no patch), "patched" (the patch guards the new
#: code), "unguarded" (every old run is gone: the call is removed).
DEPLOYED: dict[str, str] = {"body": "old"}


def effects(run_id: str) -> list[str]:
    return list(Effect.objects.filter(run_id=run_id).order_by("id").values_list("key", flat=True))


@workflow("patches.tax", version=1)
def tax(wf: WorkflowContext) -> Any:
    wf.step("price", checks.write_effect, wf.run_id, "price", 1)
    wf.sleep("quote", 60)
    body = DEPLOYED["body"]
    if body == "unguarded" or (body == "patched" and wf.patched("tax-2027")):
        wf.step("tax-2027", checks.write_effect, wf.run_id, "tax-2027", 2)
    else:
        wf.step("tax", checks.write_effect, wf.run_id, "tax", 2)
    wf.sleep("settle", 60)
    # Asked again, the same patch gives the same answer.
    again = body == "patched" and wf.patched("tax-2027")
    wf.step("ship", checks.write_effect, wf.run_id, "ship", 3)
    return again


@pytest.fixture(autouse=True)
def _old_body() -> Any:
    DEPLOYED["body"] = "old"
    yield
    DEPLOYED["body"] = "old"


def keys(run_id: str) -> list[str]:
    snap = WorkflowScope(SCOPE).get(run_id)
    assert snap is not None
    return [step.key for step in snap.steps]


def test_a_new_run_takes_the_new_path_and_records_it():
    DEPLOYED["body"] = "patched"
    start_workflow(SCOPE, "new", "patches.tax")
    snap = run_workflow(SCOPE, "new", clock=TestClock())
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output is True
    assert effects("new") == ["price", "tax-2027", "ship"]
    marker = snap.step("patch:tax-2027")
    assert marker is not None
    assert (marker.kind, marker.result) == ("patch", True)
    assert keys("new") == ["price", "quote", "patch:tax-2027", "tax-2027", "settle", "ship"]


def test_a_run_started_before_the_patch_keeps_the_old_path():
    start_workflow(SCOPE, "old", "patches.tax")
    clock = TestClock()
    run_workflows_inline(clock=clock)
    clock.advance(61)
    run_workflows_inline(clock=clock)
    assert effects("old") == ["price", "tax"]
    DEPLOYED["body"] = "patched"
    clock.advance(61)
    snap = run_workflow(SCOPE, "old", clock=clock)
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert snap.output is False
    assert effects("old") == ["price", "tax", "ship"]
    assert not WorkflowStep.objects.filter(kind="patch").exists()


def test_a_run_that_had_not_reached_the_patch_takes_the_new_path():
    # Its first steps were recorded under the old body; it had not passed the patch.
    start_workflow(SCOPE, "early", "patches.tax")
    clock = TestClock()
    run_workflows_inline(clock=clock)
    assert keys("early") == ["price", "quote"]
    DEPLOYED["body"] = "patched"
    clock.advance(61)
    snap = run_workflow(SCOPE, "early", clock=clock)
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert effects("early") == ["price", "tax-2027", "ship"]


def test_the_new_body_without_a_patch_fails_an_old_run_naming_the_skipped_key():
    start_workflow(SCOPE, "unpatched", "patches.tax")
    clock = TestClock()
    run_workflows_inline(clock=clock)
    clock.advance(61)
    run_workflows_inline(clock=clock)
    DEPLOYED["body"] = "unguarded"
    clock.advance(61)
    snap = run_workflow(SCOPE, "unpatched", clock=clock)
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "tax-2027"
    assert "were skipped: 'tax', 'settle';" in snap.error
    assert effects("unpatched") == ["price", "tax"]


def test_a_patch_call_removed_later_skips_its_recorded_marker_without_error():
    DEPLOYED["body"] = "patched"
    start_workflow(SCOPE, "later", "patches.tax")
    clock = TestClock()
    run_workflows_inline(clock=clock)
    clock.advance(61)
    run_workflows_inline(clock=clock)
    assert "patch:tax-2027" in keys("later")
    DEPLOYED["body"] = "unguarded"
    clock.advance(61)
    snap = run_workflow(SCOPE, "later", clock=clock)
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert effects("later") == ["price", "tax-2027", "ship"]


@workflow("patches.bad", version=1)
def bad_patch(wf: WorkflowContext) -> Any:
    return wf.patched(wf.input)


@pytest.mark.parametrize("patch_id", ["", "x" * 300, 7])
def test_a_patch_id_that_is_no_key_fails_the_run_and_records_nothing(patch_id: Any):
    start_workflow(SCOPE, "bad", "patches.bad", patch_id)
    snap = run_workflow(SCOPE, "bad", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("InvalidInput: "), snap.error
    assert "patch id" in snap.error
    assert snap.steps == ()


@workflow("patches.clash", version=1)
def clash(wf: WorkflowContext) -> Any:
    wf.patched("p")
    return wf.step("patch:p", checks.write_effect, wf.run_id, "clash", 1)


def test_a_step_under_a_markers_key_is_non_deterministic():
    start_workflow(SCOPE, "clash", "patches.clash")
    snap = run_workflow(SCOPE, "clash", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("NonDeterministicWorkflow: checkpoint 'patch:p'"), snap.error
    assert effects("clash") == []
