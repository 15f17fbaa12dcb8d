"""Races with several real connections (threads released together): one driver
takes a run, a signal is recorded once, the last of a map's items wakes the run
once."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import Job
from workflows import (
    RunStatus,
    SignalOutcome,
    WorkflowScope,
    send_signal,
    start_workflow,
    store,
    validation,
)
from workflows.exceptions import SignalConflict
from workflows.models import WorkflowItem, WorkflowRun
from workflows.testing import run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-races"


def wake_jobs(run_id: str, reason: str) -> int:
    pk = WorkflowRun.objects.get(run_id=run_id).pk
    return Job.objects.filter(job_id__startswith=f"wf:{pk}.0:{reason}").count()


def test_of_several_advance_jobs_at_once_one_takes_the_run(concurrently):
    start_workflow(SCOPE, "take-1", "checks.signals", {})
    pk = WorkflowRun.objects.get(run_id="take-1").pk
    outcomes = concurrently(*[lambda n=n: store.take(pk, f"job-{n}") for n in range(4)])
    assert [o.error for o in outcomes] == [None] * 4
    drivers = [o.value for o in outcomes if o.value is not None]
    assert len(drivers) == 1
    run = WorkflowRun.objects.get(pk=pk)
    assert run.driver_token == drivers[0].token
    assert run.wake_pending


def test_the_same_signal_sent_at_once_is_delivered_once_and_wakes_the_run_once(concurrently):
    start_workflow(SCOPE, "sig-race", "checks.signals", {})
    run_workflows_inline()
    outcomes = concurrently(
        *[lambda: send_signal(SCOPE, "sig-race", "approved", {"by": "ops"})] * 4
    )
    assert [o.error for o in outcomes] == [None] * 4
    assert sorted(o.value for o in outcomes) == sorted(
        [SignalOutcome.DELIVERED] + [SignalOutcome.ALREADY_SENT] * 3
    )
    assert wake_jobs("sig-race", "signal") == 1
    assert run_workflow(SCOPE, "sig-race").output == {"by": "ops"}


def test_two_payloads_for_one_signal_at_once_one_is_delivered_one_conflicts(concurrently):
    start_workflow(SCOPE, "sig-race-2", "checks.signals", {})
    outcomes = concurrently(
        lambda: send_signal(SCOPE, "sig-race-2", "approved", 1),
        lambda: send_signal(SCOPE, "sig-race-2", "approved", 2),
    )
    delivered = [o for o in outcomes if o.value is SignalOutcome.DELIVERED]
    conflicts = [o for o in outcomes if isinstance(o.error, SignalConflict)]
    assert (len(delivered), len(conflicts)) == (1, 1)
    winner = 1 if outcomes[0].value is SignalOutcome.DELIVERED else 2
    assert run_workflow(SCOPE, "sig-race-2").output == winner


def test_items_ending_at_once_wake_their_run_exactly_once(concurrently):
    start_workflow(SCOPE, "fan-race", "checks.fanout", {"items": list(range(6))})
    run_workflows_inline(max_attempts_run=1)  # the first advance: six items
    scope_hash = validation.scope_hash(SCOPE)
    items = [
        store.start_item(pk, scope_hash, job_id, timezone.now())
        for pk, job_id in WorkflowItem.objects.values_list("pk", "job_id")
    ]
    now = timezone.now()
    outcomes = concurrently(
        *[
            lambda item=item: store.end_item(
                item, "succeeded", now, result_json=str(2 * item.index)
            )
            for item in items
        ]
    )
    assert [o.value for o in outcomes] == [True] * 6
    assert wake_jobs("fan-race", "items") == 1
    # The items' own jobs find them recorded and change nothing.
    snap = run_workflow(SCOPE, "fan-race")
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output["doubled"] == [0, 2, 4, 6, 8, 10]
    assert WorkflowScope(SCOPE).get("fan-race").step("double").attempts == 1
