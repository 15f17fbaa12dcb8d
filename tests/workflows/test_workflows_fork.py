"""``WorkflowScope.fork``: a new run of the same workflow and input whose
checkpoints before a step are copies of the source's, its body going on from there
without running the copied inline steps again; bad requests write nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from jobs.models import Job
from testproject.workflow_checks import tasks as checks
from testproject.workflow_checks.models import Effect
from workflows import RunStatus, WorkflowContext, WorkflowScope, start_workflow, workflow
from workflows.exceptions import (
    InvalidInput,
    InvalidTransition,
    RunExists,
    RunNotFound,
    StepNotFound,
    UnknownWorkflow,
    WorkflowError,
)
from workflows.models import WorkflowItem, WorkflowRun, WorkflowStep
from workflows.registry import unregister_workflow
from workflows.testing import TestClock, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-fork"
runs = WorkflowScope(SCOPE)


def effects(run_id: str) -> list[str]:
    return list(Effect.objects.filter(run_id=run_id).order_by("id").values_list("key", flat=True))


@workflow("fork.ship", version=1)
def ship(wf: WorkflowContext) -> Any:
    return wf.step("label", checks.write_effect, wf.run_id, "label", f"L-{wf.input}")


@workflow("fork.order", version=1)
def order(wf: WorkflowContext) -> Any:
    reserved = wf.step("reserve", checks.write_effect, wf.run_id, "reserve", 1)
    label = wf.child("ship", "fork.ship", wf.input)
    wf.sleep("cool-off", 60)
    charged = wf.step("charge", checks.write_effect, wf.run_id, "charge", 2)
    wf.child("notify", "fork.ship", wf.input)
    return [reserved, label, charged, wf.version]


@pytest.fixture
def finished_order() -> Any:
    start_workflow(SCOPE, "order-7", "fork.order", 7)
    snap = run_workflow(SCOPE, "order-7", clock=TestClock())
    assert snap.status == RunStatus.SUCCEEDED
    return snap


def test_a_fork_from_a_later_step_does_not_redo_the_copied_inline_steps(finished_order):
    forked = runs.fork("order-7", "order-7-again", from_step="charge")
    assert forked.created
    assert (forked.name, forked.version, forked.input) == ("fork.order", 1, 7)
    assert forked.status == RunStatus.WAITING
    assert [step.key for step in forked.steps] == ["reserve", "ship", "cool-off"]
    assert [step.result for step in forked.steps][:2] == [1, "L-7"]
    snap = run_workflow(SCOPE, "order-7-again", clock=TestClock())
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == [1, "L-7", 2, 1]
    # Only the steps from "charge" on ran for the fork; the copied ones did not.
    assert effects("order-7-again") == ["charge"]
    assert effects("order-7-again/ship") == []
    assert effects("order-7-again/notify") == ["label"]
    # The child before the step was copied under the fork's id, and linked.
    child = runs.get("order-7-again/ship")
    assert child is not None
    assert (child.status, child.output, child.parent_run_id) == (
        RunStatus.SUCCEEDED,
        "L-7",
        "order-7-again",
    )
    assert snap.step("ship").child_run_id == "order-7-again/ship"
    # The source is untouched.
    assert runs.get("order-7").steps == finished_order.steps


def test_a_fork_from_a_step_before_a_child_does_not_copy_the_child(finished_order):
    forked = runs.fork("order-7", "order-7-early", from_step="ship")
    assert [step.key for step in forked.steps] == ["reserve"]
    assert runs.get("order-7-early/ship") is None
    snap = run_workflow(SCOPE, "order-7-early", clock=TestClock())
    assert snap.status == RunStatus.SUCCEEDED
    assert effects("order-7-early") == ["charge"]
    assert effects("order-7-early/ship") == ["label"]


def test_a_fork_runs_on_the_version_asked(finished_order):
    @workflow("fork.order", version=2)
    def order_v2(wf: WorkflowContext) -> Any:
        reserved = wf.step("reserve", checks.write_effect, wf.run_id, "reserve", 1)
        return [reserved, "fixed", wf.version]

    try:
        forked = runs.fork("order-7", "order-7-v2", from_step="ship", version=2)
        assert forked.version == 2
        snap = run_workflow(SCOPE, "order-7-v2", clock=TestClock())
    finally:
        unregister_workflow("fork.order", 2)
    assert snap.output == [1, "fixed", 2]
    assert effects("order-7-v2") == []


def counts() -> tuple[int, int, int, int]:
    return (
        WorkflowRun.objects.count(),
        WorkflowStep.objects.count(),
        WorkflowItem.objects.count(),
        Job.objects.count(),
    )


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"new_run_id": "x", "from_step": "never-reached"}, StepNotFound),
        ({"new_run_id": "order-7", "from_step": "charge"}, RunExists),
        ({"new_run_id": "order-7/ship", "from_step": "charge"}, RunExists),
        ({"new_run_id": "x", "from_step": "charge", "version": 9}, UnknownWorkflow),
        ({"new_run_id": "x", "from_step": ""}, InvalidInput),
        ({"new_run_id": "x\x00", "from_step": "charge"}, InvalidInput),
    ],
)
def test_a_bad_fork_is_a_typed_error_and_writes_nothing(finished_order, kwargs, error):
    before = counts()
    with pytest.raises(error) as raised:
        runs.fork("order-7", **kwargs)
    assert isinstance(raised.value, WorkflowError)
    assert counts() == before


def test_a_fork_whose_copied_child_id_is_taken_writes_nothing(finished_order):
    start_workflow(SCOPE, "order-7-b/ship", "fork.ship", 1)
    before = counts()
    with pytest.raises(RunExists, match="order-7-b/ship"):
        runs.fork("order-7", "order-7-b", from_step="charge")
    assert counts() == before


def test_an_unknown_run_is_not_found_and_a_run_being_advanced_is_refused(finished_order):
    with pytest.raises(RunNotFound):
        runs.fork("nope", "x", from_step="charge")
    with pytest.raises(RunNotFound):
        WorkflowScope("another-tenant").fork("order-7", "x", from_step="charge")
    WorkflowRun.objects.filter(run_id="order-7").update(status=RunStatus.RUNNING)
    before = counts()
    with pytest.raises(InvalidTransition, match="being advanced"):
        runs.fork("order-7", "x", from_step="charge")
    assert counts() == before


FLAKY: dict[str, bool] = {"broken": True}


def charge(run_id: str) -> int:
    checks.write_effect(run_id, "charge", 1)
    if FLAKY["broken"]:
        raise RuntimeError("bug")
    return 2


@workflow("fork.fails", version=1)
def fails(wf: WorkflowContext) -> Any:
    wf.step("reserve", checks.write_effect, wf.run_id, "reserve", 1)
    prices = wf.map("price", checks.double, [{"run": wf.run_id, "value": n} for n in (1, 2)])
    return [prices, wf.step("charge", charge, wf.run_id)]


def test_a_failed_run_forked_from_its_failed_step_runs_it_again_on_fixed_code():
    FLAKY["broken"] = True
    start_workflow(SCOPE, "failed", "fork.fails")
    assert run_workflow(SCOPE, "failed", clock=TestClock()).status == RunStatus.FAILED
    FLAKY["broken"] = False
    forked = runs.fork("failed", "failed-fixed", from_step="charge")
    # The map before the step is copied with its items (the picture counts them).
    price = forked.step("price")
    assert price is not None
    assert price.items is not None
    assert (price.items.total, price.items.succeeded) == (2, 2)
    jobs = Job.objects.count()
    snap = run_workflow(SCOPE, "failed-fixed", clock=TestClock())
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == [[2, 4], 2]
    assert effects("failed-fixed") == ["charge"]
    # No item ran again: the only new job is the fork's advance.
    assert Job.objects.count() == jobs


# -- the admin's "fork from this step" ------------------------------------------------


def staff(*codenames: str) -> Client:
    user = User.objects.create_user(f"staff-{'-'.join(codenames)}", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def run_pk(run_id: str) -> int:
    return WorkflowRun.objects.get(run_id=run_id).pk


def test_the_run_page_offers_a_fork_from_each_step_to_users_who_may_steer(finished_order):
    page = reverse("admin:workflows_workflowrun_change", args=[run_pk("order-7")])
    fork_url = reverse("admin:workflows_workflowrun_fork", args=[run_pk("order-7")])
    steering = staff("view_workflowrun", "change_workflowrun").get(page).content.decode()
    assert f'href="{fork_url}?from_step=charge">fork from this step</a>' in steering
    viewer = staff("view_workflowrun")
    assert "fork from this step" not in viewer.get(page).content.decode()
    assert viewer.get(f"{fork_url}?from_step=charge").status_code == 403
    assert viewer.post(fork_url, {"from_step": "charge", "new_run_id": "x"}).status_code == 403
    assert runs.get("x") is None


def test_the_fork_form_forks_and_opens_the_new_run(finished_order):
    client = staff("view_workflowrun", "change_workflowrun")
    fork_url = reverse("admin:workflows_workflowrun_fork", args=[run_pk("order-7")])
    form = client.get(f"{fork_url}?from_step=charge").content.decode()
    assert 'value="charge"' in form
    assert 'value="order-7-fork"' in form
    response = client.post(fork_url, {"from_step": "charge", "new_run_id": "order-7-fork"})
    assert response.status_code == 302
    assert response["Location"] == reverse(
        "admin:workflows_workflowrun_change", args=[run_pk("order-7-fork")]
    )
    forked = runs.get("order-7-fork")
    assert forked is not None
    assert [step.key for step in forked.steps] == ["reserve", "ship", "cool-off"]


def test_a_refused_fork_in_the_admin_says_why_and_writes_nothing(finished_order):
    client = staff("view_workflowrun", "change_workflowrun")
    fork_url = reverse("admin:workflows_workflowrun_fork", args=[run_pk("order-7")])
    before = counts()
    taken = client.post(fork_url, {"from_step": "charge", "new_run_id": "order-7"})
    assert taken.status_code == 200
    assert "exists in this scope; a fork needs a new run id" in taken.content.decode()
    unknown = client.post(fork_url, {"from_step": "nope", "new_run_id": "y"})
    assert "never reached a checkpoint &#x27;nope&#x27;" in unknown.content.decode()
    assert counts() == before


@workflow("fork.timed", version=1, timeout=3600)
def timed(wf: WorkflowContext) -> Any:
    wf.step("reserve", checks.write_effect, wf.run_id, "reserve", 1)
    return wf.wait_for_signal("go")


def test_a_fork_has_its_versions_declared_deadline_counted_from_the_fork():
    start_workflow(SCOPE, "timed", "fork.timed")
    run_workflow(SCOPE, "timed", clock=TestClock())
    forked = runs.fork("timed", "timed-again", from_step="go")
    row = WorkflowRun.objects.get(run_id="timed-again")
    assert row.deadline is not None
    assert row.deadline - forked.created_at == timedelta(seconds=3600)
