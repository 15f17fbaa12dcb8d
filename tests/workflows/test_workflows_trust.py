"""The engine's own handlers act only on the ids their job was staged for, checked
against the job's scope: a job of another tenant that names the engine's handlers
and a run's or an item's ids (a generic "submit a job" endpoint, or a bug) fails
with ``UntrustedJob`` and changes nothing of that run, on both databases."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs import JobScope, JobStatus, JobSubmission, submit_job
from jobs.models import Job
from jobs.testing import run_jobs_inline
from jobs.types import FinishOutcome
from workflows import RunStatus, WorkflowScope, start_workflow, store
from workflows.models import WorkflowItem, WorkflowRun, WorkflowSignal, WorkflowStep
from workflows.store import ADVANCE_HANDLER, advance_scope_hash, take
from workflows.testing import run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db(transaction=True)

TENANT_A = "tenant-a-trust"
TENANT_B = "tenant-b-trust"
EVIL = "evil"  # tenant B's jobs run alone, from a queue of their own


def workflows_state() -> list[list[dict[str, Any]]]:
    """Every row of every workflows table, every column."""
    return [
        list(model.objects.order_by("pk").values())
        for model in (WorkflowRun, WorkflowStep, WorkflowItem, WorkflowSignal)
    ]


def jobs_outside(scope: str) -> list[dict[str, Any]]:
    """Every job row but those of ``scope``."""
    return list(Job.objects.exclude(scope_hash=JobScope(scope).scope_hash).order_by("pk").values())


def test_a_tenant_b_job_with_an_engine_handler_and_tenant_a_ids_changes_nothing_of_a():
    # Tenant A: one run waiting for its map's two items, one run held by a driver
    # (its advance job "wf:{pk}.0:start" running on a worker).
    start_workflow(TENANT_A, "a-map", "checks.fanout", {"items": [1, 2]})
    run_workflows_inline(max_attempts_run=1)
    start_workflow(TENANT_A, "a-held", "checks.linear", {"start": 1})
    held = WorkflowRun.objects.get(run_id="a-held")
    held_job = f"wf:{held.pk}.0:start"
    assert take(held.pk, held_job) is not None
    mapped = WorkflowRun.objects.get(run_id="a-map")
    items = list(WorkflowItem.objects.filter(step__run=mapped).order_by("index"))
    assert [item.status for item in items] == ["running", "running"]
    sealed_payload = Job.objects.get(job_id=items[0].job_id).payload_json
    then_id = items[0].job_id.rsplit(":", 1)[0] + ":then"

    # Tenant B knows (or guesses) A's ids and submits jobs of the engine's handlers.
    forged = [
        # Take over A's running run under its driver's job id.
        (held_job, ADVANCE_HANDLER, {"run": held.pk}),
        # Wake A's waiting run.
        (f"wf:{mapped.pk}.0:items:forged", ADVANCE_HANDLER, {"run": mapped.pk}),
        # Run A's item under the item job's own id (its sealed payload copied whole:
        # sealed for A's scope only), and under another id.
        (items[0].job_id, "checks.double", json.loads(sealed_payload)),
        ("wf-item:forged", "checks.double", {"item": items[1].pk}),
        ("no-item", "checks.double", {"run": mapped.pk}),
        # Wake A's run as the job that follows its items would.
        (then_id, store.ITEMS_ENDED_HANDLER, {"step": items[0].step_id}),
    ]
    for job_id, handler, payload in forged:
        submit_job(TENANT_B, job_id, JobSubmission.create(handler, payload, queue=EVIL))
    before = (workflows_state(), jobs_outside(TENANT_B))

    runs = run_jobs_inline(queues=[EVIL])

    assert len(runs) == len(forged)
    for job in JobScope(TENANT_B).list():
        assert job.status == JobStatus.FAILED, job.job_id
        assert "UntrustedJob" in job.error, job.error
        assert job.attempt_count == 1  # not retried
    assert (workflows_state(), jobs_outside(TENANT_B)) == before

    # A's runs go on through their own jobs as if nothing happened.
    run_workflows_inline()  # the items of "a-map"
    assert WorkflowScope(TENANT_A).get("a-map").output == {"doubled": [2, 4], "total": 6}
    WorkflowRun.objects.filter(pk=held.pk).update(status=RunStatus.WAITING, driver_job=None)
    assert run_workflow(TENANT_A, "a-held").output == {"a": 1, "b": 2}


def test_advance_jobs_of_a_tenant_scope_advance_nothing_even_with_a_fresh_id():
    start_workflow(TENANT_A, "a-fresh", "checks.linear", {"start": 3})
    run_pk = WorkflowRun.objects.get(run_id="a-fresh").pk
    # The reserved scope's name as a tenant's scope is just another tenant.
    submit_job(
        "workflows",
        f"wf:{run_pk}.0:anything",
        JobSubmission.create(ADVANCE_HANDLER, {"run": run_pk}, queue=EVIL),
    )
    before = workflows_state()
    (ran,) = run_jobs_inline(queues=[EVIL])
    assert ran.outcome is FinishOutcome.FAILED
    assert "UntrustedJob: job " in ran.error
    assert workflows_state() == before


def test_item_job_ids_hold_a_part_no_one_can_guess():
    start_workflow(TENANT_A, "a-ids", "checks.fanout", {"items": [1, 2, 3]})
    start_workflow(TENANT_A, "a-ids-2", "checks.fanout", {"items": [1]})
    run_workflows_inline()
    job_ids = list(WorkflowItem.objects.order_by("pk").values_list("job_id", flat=True))
    random_parts = [job_id.split(":")[2] for job_id in job_ids]
    assert all(len(part) == 20 for part in random_parts)
    # One random part per batch of items: the two maps' differ.
    assert random_parts[0] == random_parts[1] == random_parts[2] != random_parts[3]
    # Each is the id of a job of the run's own scope, staged for its item, and its
    # payload is sealed for that job only: the same payload under another id or in
    # another scope names no item without the item's row being checked.
    for item in WorkflowItem.objects.all():
        job = Job.objects.get(job_id=item.job_id)
        assert job.scope_hash == JobScope(TENANT_A).scope_hash
        payload = json.loads(job.payload_json)
        assert (payload["item"], payload["args"]) == (item.pk, item.args_json)
        sealed = store.sealed_item(job.scope_hash, job.job_id, payload)
        assert sealed is not None
        assert sealed.pk == item.pk
        assert store.sealed_item(JobScope(TENANT_B).scope_hash, job.job_id, payload) is None
        assert store.sealed_item(job.scope_hash, job.job_id + "0", payload) is None
        forged = {**payload, "args": '{"args":[{"run":"a-ids","value":99}],"kwargs":{}}'}
        assert store.sealed_item(job.scope_hash, job.job_id, forged) is None
    assert advance_scope_hash() != JobScope(TENANT_A).scope_hash
