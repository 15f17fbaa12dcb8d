"""``manage.py check_workflows``: every run in flight replayed against the code
installed, running no step and writing nothing; the first divergent key of each run
that would not replay as recorded, and exit status 1 when any would not."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from testproject.workflow_checks import tasks as checks
from testproject.workflow_checks.models import Effect
from workflows import (
    RunStatus,
    StepFailed,
    WorkflowContext,
    WorkflowScope,
    start_workflow,
    workflow,
)
from workflows.checking import Reason, check_runs
from workflows.models import WorkflowRun, WorkflowStep
from workflows.registry import unregister_workflow
from workflows.testing import TestClock, run_workflow, run_workflows_inline
from workflows.validation import scope_hash

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-check"

#: The body "deployed" now, by its name: what the check replays against.
BODY: dict[str, str] = {}


def effects() -> list[str]:
    return list(Effect.objects.order_by("id").values_list("key", flat=True))


@workflow("check.order", version=1)
def order(wf: WorkflowContext) -> Any:
    wf.step("reserve", checks.write_effect, wf.run_id, "reserve", 1)
    body = BODY.get("order", "old")
    if body == "flipped":
        wf.step("charge-card", checks.write_effect, wf.run_id, "charge-card", 2)
    elif body == "kind":
        wf.sleep("charge", 5)
    elif body == "bad-query" and wf.run_id == "bad-query":
        Effect.objects.create(run_id=wf.run_id, key=None)
    elif body == "patched" and wf.patched("card"):
        wf.step("charge-card", checks.write_effect, wf.run_id, "charge-card", 2)
    else:
        wf.step("charge", checks.write_effect, wf.run_id, "charge", 2)
    # Written by the body itself at every replay: the check rolls it back.
    Effect.objects.create(run_id=wf.run_id, key="replayed")
    payment = wf.wait_for_signal("paid")
    wf.step("ship", checks.write_effect, wf.run_id, "ship", 3)
    return payment


@workflow("check.fails", version=1)
def fails(wf: WorkflowContext) -> Any:
    wf.step("reserve", checks.write_effect, wf.run_id, "reserve", 1)
    wf.step("boom", checks.flaky, wf.run_id, "boom", 5)
    return "never"


@pytest.fixture(autouse=True)
def _old_bodies() -> Any:
    BODY.clear()
    yield
    BODY.clear()


def start_orders(*run_ids: str) -> None:
    for run_id in run_ids:
        start_workflow(SCOPE, run_id, "check.order")
    run_workflows_inline(clock=TestClock())
    Effect.objects.filter(key="replayed").delete()


def check() -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("check_workflows", stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_runs_that_replay_as_recorded_pass_and_nothing_runs_or_is_written():
    start_orders("a", "b")
    steps = list(WorkflowStep.objects.order_by("id").values_list("key", "status", "finished_at"))
    runs = list(WorkflowRun.objects.order_by("id").values_list("status", "updated_at", "advances"))
    before = effects()
    status, out = check()
    assert status == 0, out
    assert "check.order v1: 2 of 2 run(s) in flight replay cleanly" in out
    assert effects() == before
    assert (
        list(WorkflowStep.objects.order_by("id").values_list("key", "status", "finished_at"))
        == steps
    )
    assert (
        list(WorkflowRun.objects.order_by("id").values_list("status", "updated_at", "advances"))
        == runs
    )


def test_a_flipped_branch_exits_1_naming_the_run_and_its_first_divergent_key():
    start_orders("flips")
    start_workflow(SCOPE, "failed", "check.fails")
    run_workflow(SCOPE, "failed", clock=TestClock())
    BODY["order"] = "flipped"
    status, out = check()
    assert status == 1
    assert "check.order v1: 0 of 1 run(s) in flight replay cleanly" in out
    assert "check.fails v1: 1 of 1 run(s) in flight replay cleanly" in out
    line = f"  {scope_hash(SCOPE)} flips at 'charge-card': reached as a new checkpoint"
    assert line in out, out
    assert "recorded checkpoints were skipped: 'charge', 'paid'" in out
    (divergence,) = check_runs()[1].divergences
    assert (divergence.run_id, divergence.key, divergence.reason) == (
        "flips",
        "charge-card",
        Reason.SKIPPED,
    )
    assert divergence.skipped == ("charge", "paid")
    # Nothing ran: the new branch's step wrote nothing.
    assert "charge-card" not in effects()


def test_a_recorded_key_reached_as_another_kind_is_reported():
    start_orders("kind")
    BODY["order"] = "kind"
    status, out = check()
    assert status == 1
    (verdict,) = check_runs()
    (divergence,) = verdict.divergences
    assert (divergence.key, divergence.reason) == ("charge", Reason.ANOTHER_KIND)
    assert "recorded as a step checkpoint, reached now as a sleep" in out


def test_a_patch_keeps_old_runs_clean_where_the_bare_change_would_not():
    start_orders("before-patch")
    BODY["order"] = "patched"
    status, out = check()
    assert status == 0, out
    assert not WorkflowStep.objects.filter(kind="patch").exists()


def test_a_version_the_code_no_longer_defines_is_reported():
    @workflow("check.gone", version=1)
    def gone(wf: WorkflowContext) -> Any:
        return wf.wait_for_signal("never")

    try:
        start_workflow(SCOPE, "gone", "check.gone")
        run_workflows_inline(clock=TestClock())
    finally:
        unregister_workflow("check.gone", 1)
    status, out = check()
    assert status == 1
    assert f"  {scope_hash(SCOPE)} gone: the code defines no workflow 'check.gone' version 1" in out
    (verdict,) = check_runs()
    assert verdict.divergences[0].reason == Reason.MISSING_VERSION


def test_a_failed_run_that_replays_to_its_own_failure_is_clean():
    start_workflow(SCOPE, "failed", "check.fails")
    snap = run_workflow(SCOPE, "failed", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "boom"
    status, out = check()
    assert status == 0, out
    assert "check.fails v1: 1 of 1 run(s) in flight replay cleanly" in out


def test_an_error_the_run_did_not_record_is_reported():
    # A Waiting run whose body now raises before its frontier would fail at deploy.
    start_orders("raises")

    @workflow("check.order", version=2)
    def order_v2(wf: WorkflowContext) -> Any:
        raise KeyError("total")

    try:
        WorkflowRun.objects.filter(run_id="raises").update(version=2)
        (verdict,) = check_runs()
    finally:
        unregister_workflow("check.order", 2)
    (divergence,) = verdict.divergences
    assert divergence.reason == Reason.RAISES
    assert divergence.describe() == "raises KeyError: 'total', which the run did not record"


def test_finished_runs_are_not_checked():
    start_orders("done")
    WorkflowRun.objects.filter(run_id="done").update(status=RunStatus.SUCCEEDED)
    BODY["order"] = "flipped"
    status, out = check()
    assert status == 0
    assert "No workflow run in flight." in out


def test_a_body_whose_own_query_fails_is_reported_and_the_check_goes_on():
    start_orders("bad-query", "fine")
    BODY["order"] = "bad-query"
    (verdict,) = check_runs()
    assert verdict.checked == 2
    (divergence,) = verdict.divergences
    assert (divergence.run_id, divergence.reason) == ("bad-query", Reason.RAISES)
    assert divergence.detail.startswith("IntegrityError: ")
    assert not Effect.objects.filter(key="replayed").exists()


@workflow("check.compensates", version=1)
def compensates(wf: WorkflowContext) -> Any:
    try:
        wf.step("charge", checks.flaky, wf.run_id, "charge", 5)
    except StepFailed:
        wf.step("release", checks.write_effect, wf.run_id, "release", 1)
        if BODY.get("compensates") == "returns":
            return "released"
        wf.wait_for_signal("retry")
    return "charged"


def test_a_resumed_run_stops_cleanly_at_its_erased_step_and_a_body_that_now_returns_does_not():
    # Its charge failed, was compensated, the run failed; resumed, the charge is
    # erased and stands before the recorded release: the check stops there, cleanly.
    start_workflow(SCOPE, "resumed", "check.compensates")
    run_workflow(SCOPE, "resumed", clock=TestClock())
    WorkflowRun.objects.filter(run_id="resumed").update(status=RunStatus.FAILED)
    WorkflowScope(SCOPE).resume("resumed")
    assert WorkflowRun.objects.get(run_id="resumed").rerun_keys == ["charge"]
    assert check() == (0, "check.compensates v1: 1 of 1 run(s) in flight replay cleanly\n")
    # Both runs wait for their signal: a body that now returns before it skips it.
    start_workflow(SCOPE, "waits", "check.compensates")
    run_workflow(SCOPE, "waits", clock=TestClock())
    BODY["compensates"] = "returns"
    divergences = [d for v in check_runs() for d in v.divergences]
    assert [(d.run_id, d.key, d.reason, d.skipped) for d in divergences] == [
        ("resumed", "", Reason.SKIPPED, ("retry",)),
        ("waits", "", Reason.SKIPPED, ("retry",)),
    ]
    assert divergences[0].describe() == (
        "the body returns while recorded checkpoints were skipped: 'retry'"
    )
