"""The jobs that advance runs live in the reserved scope "workflows": the tenant of
that name can neither see nor touch them, nor pre-empt a run's wake-up by taking its
job id first; trusted code reaches them with ``execution.reserved_scope``."""

from __future__ import annotations

import pytest

from jobs import JobScope, JobStatus, JobSubmission, execution, submit_job
from jobs.exceptions import JobNotFound
from jobs.models import Job
from workflows import RunStatus, start_workflow
from workflows.models import WorkflowRun
from workflows.store import ADVANCE_HANDLER, advance_scope_hash
from workflows.testing import run_workflow

pytestmark = pytest.mark.django_db(transaction=True)


def test_advance_jobs_are_in_the_reserved_scope_no_tenant_reaches() -> None:
    start_workflow("tenant-a", "r-1", "checks.linear", {"start": 1})
    pk = WorkflowRun.objects.get(run_id="r-1").pk
    start_job = f"wf:{pk}.0:start"

    reserved = execution.reserved_scope("workflows")
    assert advance_scope_hash() == reserved.scope_hash
    assert advance_scope_hash() != JobScope("workflows").scope_hash
    job = reserved.get(start_job)
    assert job is not None
    assert job.handler == ADVANCE_HANDLER
    assert job.status == JobStatus.QUEUED

    tenant = JobScope("workflows")
    assert tenant.get(start_job) is None
    assert tenant.list() == []
    with pytest.raises(JobNotFound):
        tenant.cancel(start_job)
    with pytest.raises(JobNotFound):
        tenant.retry(start_job, extra_attempts=1)
    assert reserved.get(start_job).status == JobStatus.QUEUED  # type: ignore[union-attr]

    # The tenant taking the id of the run's next wake-up first changes nothing: its
    # job is its own, and the run still finishes through its own advance jobs.
    submit_job("workflows", start_job, JobSubmission.create("evil.handler"))
    assert Job.objects.filter(job_id=start_job).count() == 2
    done = run_workflow("tenant-a", "r-1")
    assert done.status == RunStatus.SUCCEEDED
    assert tenant.get(start_job).handler == "evil.handler"  # type: ignore[union-attr]
