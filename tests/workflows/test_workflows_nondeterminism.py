"""A body that takes another path than the one its run recorded fails the run with
``NonDeterministicWorkflow`` naming the recorded checkpoints it skipped, before the new
path's first checkpoint runs: a random branch or a key built from the time never runs
both paths' steps. A resumed run records its erased checkpoints again where they stood,
which skips nothing."""

from __future__ import annotations

import contextlib
import itertools
import pickle
from typing import Any

import pytest

from testproject.workflow_checks import tasks as checks
from testproject.workflow_checks.models import Effect
from workflows import RunStatus, WorkflowContext, WorkflowScope, start_workflow, workflow
from workflows.exceptions import NonDeterministicWorkflow, StepFailed
from workflows.models import WorkflowRun
from workflows.testing import TestClock, run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-nondeterminism"

#: The branch each run's body takes this time, by run id (a stand-in for random()).
BRANCH: dict[str, str] = {}
#: A counter each run's body reads at every replay (a stand-in for the time).
CLOCKS: dict[str, itertools.count[int]] = {}
#: Whether each run's "charge" step fails this time.
DECLINED: dict[str, bool] = {}


def effects(run_id: str) -> list[str]:
    return list(Effect.objects.filter(run_id=run_id).order_by("id").values_list("key", flat=True))


@workflow("nondet.branch", version=1)
def random_branch(wf: WorkflowContext) -> Any:
    wf.step("first", checks.write_effect, wf.run_id, "first", 1)
    side = BRANCH[wf.run_id]
    wf.step(f"{side}-work", checks.write_effect, wf.run_id, f"{side}-work", 2)
    wf.sleep("nap", 60)
    wf.step("last", checks.write_effect, wf.run_id, "last", 3)
    return side


@workflow("nondet.stamp", version=1)
def key_from_the_time(wf: WorkflowContext) -> Any:
    stamp = next(CLOCKS[wf.run_id])
    wf.step(f"fetch-{stamp}", checks.write_effect, wf.run_id, f"fetch-{stamp}", stamp)
    wf.sleep("nap", 60)
    return stamp


def test_a_random_branch_fails_the_run_before_the_other_branch_runs():
    BRANCH["coin"] = "heads"
    start_workflow(SCOPE, "coin", "nondet.branch")
    clock = TestClock()
    run_workflows_inline(clock=clock)
    assert WorkflowScope(SCOPE).get("coin").waiting_for.startswith("timer until")
    BRANCH["coin"] = "tails"
    clock.advance(61)
    snap = run_workflow(SCOPE, "coin", clock=clock)
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "tails-work"
    assert snap.error.startswith(
        "NonDeterministicWorkflow: checkpoint 'tails-work': reached as a new checkpoint "
        "while recorded checkpoints were skipped: 'heads-work', 'nap';"
    ), snap.error
    assert effects("coin") == ["first", "heads-work"]
    assert [step.key for step in snap.steps] == ["first", "heads-work", "nap"]


def test_a_key_built_from_the_time_fails_the_run_at_its_next_replay():
    CLOCKS["stamp"] = itertools.count(1)
    start_workflow(SCOPE, "stamp", "nondet.stamp")
    snap = run_workflow(SCOPE, "stamp", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "fetch-2"
    assert "were skipped: 'fetch-1', 'nap';" in snap.error
    assert effects("stamp") == ["fetch-1"]


def test_the_same_path_replayed_many_times_is_deterministic():
    BRANCH["steady"] = "heads"
    start_workflow(SCOPE, "steady", "nondet.branch")
    snap = run_workflow(SCOPE, "steady", clock=TestClock())
    assert snap.status == RunStatus.SUCCEEDED
    assert effects("steady") == ["first", "heads-work", "last"]


@workflow("nondet.swallow", version=1)
def swallow(wf: WorkflowContext) -> Any:
    stamp = next(CLOCKS[wf.run_id])
    with contextlib.suppress(NonDeterministicWorkflow):
        wf.step(f"fetch-{stamp}", checks.write_effect, wf.run_id, "fetch", stamp)
    wf.sleep("nap", 60)
    return "swallowed"


def test_a_body_that_catches_the_error_still_fails_its_run():
    CLOCKS["swallow"] = itertools.count(1)
    start_workflow(SCOPE, "swallow", "nondet.swallow")
    snap = run_workflow(SCOPE, "swallow", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("NonDeterministicWorkflow: checkpoint 'fetch-2'")


def charge_card(run_id: str) -> str:
    checks.write_effect(run_id, "charge", 1)
    if DECLINED[run_id]:
        raise RuntimeError("card declined")
    return "charged"


@workflow("nondet.compensating", version=1)
def compensating(wf: WorkflowContext) -> Any:
    try:
        wf.step("charge", charge_card, wf.run_id)
    except StepFailed:
        wf.step("release", checks.write_effect, wf.run_id, "release", 1)
        raise RuntimeError("gave up after releasing the stock") from None
    wf.step("ship", checks.write_effect, wf.run_id, "ship", 1)
    return "shipped"


def test_a_resumed_step_is_recorded_again_where_it_stood():
    # The body caught the failed step, compensated, and failed: the resumed step is
    # new again, but it stands before the compensation recorded after it.
    DECLINED["again"] = True
    start_workflow(SCOPE, "again", "nondet.compensating")
    assert run_workflow(SCOPE, "again").status == RunStatus.FAILED
    WorkflowScope(SCOPE).resume("again")
    assert WorkflowRun.objects.get(run_id="again").rerun_keys == ["charge"]
    snap = run_workflow(SCOPE, "again")
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("RuntimeError: gave up after releasing the stock")
    assert [step.key for step in snap.steps] == ["release", "charge"]
    # The charge was tried again; the recorded compensation was not run twice.
    assert effects("again") == ["release"]


def test_a_resumed_step_that_now_takes_the_other_path_is_non_deterministic():
    # The compensation happened; shipping now as well would run both paths.
    DECLINED["other"] = True
    start_workflow(SCOPE, "other", "nondet.compensating")
    assert run_workflow(SCOPE, "other").status == RunStatus.FAILED
    DECLINED["other"] = False
    WorkflowScope(SCOPE).resume("other")
    snap = run_workflow(SCOPE, "other")
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "ship"
    assert "were skipped: 'release';" in snap.error
    assert effects("other") == ["release", "charge"]


def test_the_error_keeps_the_skipped_keys():
    error = NonDeterministicWorkflow("new", "skipped some", ("a", "b"))
    assert error.skipped == ("a", "b")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.key, copy.skipped, str(copy)) == ("new", ("a", "b"), str(error))
