"""An activity item's end is fenced by its job's attempt, like any late finish: a try
that ran past its timeout (or whose lease another worker recovered) and returns
afterwards records nothing; the try that took over records the item."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs import JobScope, execution
from jobs.context import JobContext
from jobs.testing import run_jobs_inline
from jobs.types import FinishOutcome
from workflows import RunStatus, StepStatus, WorkflowContext, activity, start_workflow, workflow
from workflows.engine import run_item
from workflows.models import WorkflowItem
from workflows.registry import get_activity
from workflows.testing import TestClock, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-item-fence"
CALLS: list[int] = []


@activity("itemfence.double", queue="itemfence-held", retries=2)
def double(value: int) -> int:
    CALLS.append(value)
    return value * 2


@workflow("itemfence.fanout", version=1)
def fanout(wf: WorkflowContext) -> Any:
    return wf.map("double", double, [21])


def test_a_try_that_returns_after_its_attempt_ended_records_nothing() -> None:
    CALLS.clear()
    start_workflow(SCOPE, "late", "itemfence.fanout")
    run_jobs_inline(queues=["default"])  # the advance: the item's job is queued
    (job,) = JobScope(SCOPE).list(handler="itemfence.double")
    claim = execution.try_start(job.scope_hash, job.job_id, worker_id="slow-worker")
    assert claim is not None
    # The attempt ends before the handler returns (its timeout, as the worker's
    # timeout watch ends it), and the job is queued for another try.
    now = timezone.now()
    outcome = execution.fail(claim.token, "timed out", retry_at=now - timedelta(seconds=1))
    assert outcome == FinishOutcome.REQUEUED

    run_item(get_activity("itemfence.double"), JobContext(claim))  # the late try returns

    item = WorkflowItem.objects.get(job_id=job.job_id)
    assert (item.status, item.result_json) == (StepStatus.RUNNING, None)
    snap = run_workflow(SCOPE, "late", clock=TestClock())
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == [42]
    assert CALLS == [21, 21]  # the late try ran; the try that took over recorded it
