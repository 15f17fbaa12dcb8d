"""The engine's own jobs: a finished or purged run leaves no advance job Queued (its
timers and signal timeouts are cancelled with it, in the same transaction), and
the jobs admin hides the advances unless asked, while the activities' item jobs,
which run your code, stay listed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs import JobStatus
from jobs.models import Job
from workflows import RunStatus, WorkflowScope, send_signal, start_workflow, store
from workflows.models import WorkflowRun
from workflows.testing import TestClock, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-engine-jobs"


def advance_jobs(run_id: str) -> dict[str, str]:
    """The run's advance jobs by reason, with their status."""
    pk = WorkflowRun.objects.get(run_id=run_id).pk
    jobs = Job.objects.filter(handler=store.ADVANCE_HANDLER, job_id__startswith=f"wf:{pk}.")
    return {job_id.split(":")[2]: status for job_id, status in jobs.values_list("job_id", "status")}


def test_a_run_that_finishes_cancels_its_queued_wake_ups():
    start_workflow(SCOPE, "sig-1", "checks.signals", {"timeout": 3600})
    start_workflow(SCOPE, "other", "checks.signals", {"timeout": 3600})
    clock = TestClock()
    run_workflow(SCOPE, "sig-1", clock=clock)
    run_workflow(SCOPE, "other", clock=clock)
    assert advance_jobs("sig-1")["signal-timeout"] == JobStatus.QUEUED
    send_signal(SCOPE, "sig-1", "approved", "yes")
    assert run_workflow(SCOPE, "sig-1", clock=clock).status == RunStatus.SUCCEEDED
    assert advance_jobs("sig-1") == {
        "start": JobStatus.SUCCEEDED,
        "signal": JobStatus.SUCCEEDED,
        "signal-timeout": JobStatus.CANCELLED,
    }
    # Another run's wake-up stays.
    assert advance_jobs("other")["signal-timeout"] == JobStatus.QUEUED
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 1


def test_a_waiting_run_cancelled_cancels_its_timer():
    start_workflow(SCOPE, "nap-1", "checks.sleeper", {"seconds": 3600})
    run_workflow(SCOPE, "nap-1", clock=TestClock(), max_rounds=1)
    assert advance_jobs("nap-1")["timer"] == JobStatus.QUEUED
    assert WorkflowScope(SCOPE).cancel("nap-1") == "cancelled"
    assert advance_jobs("nap-1")["timer"] == JobStatus.CANCELLED


def test_a_purged_run_leaves_no_queued_wake_up():
    start_workflow(SCOPE, "old-1", "checks.signals", {"timeout": 3600})
    run_workflow(SCOPE, "old-1", clock=TestClock())
    WorkflowScope(SCOPE).cancel("old-1")
    # A run finished before its wake-ups were cancelled with it: one still Queued.
    Job.objects.filter(job_id__contains=":signal-timeout").update(status=JobStatus.QUEUED)
    WorkflowRun.objects.update(finished_at=timezone.now() - timedelta(days=2))
    assert store.purge_finished(older_than=timezone.now() - timedelta(days=1)) == 1
    assert not Job.objects.filter(status=JobStatus.QUEUED).exists()
    assert Job.objects.filter(job_id__contains=":signal-timeout").get().status == "cancelled"


def test_the_jobs_admin_hides_advance_jobs_and_lists_item_jobs(admin_client: Client):
    start_workflow(SCOPE, "map-1", "checks.fanout", {"items": [1, 2]})
    run_workflow(SCOPE, "map-1")
    page = reverse("admin:jobs_job_changelist")

    def handlers(**params: str) -> list[str]:
        response = admin_client.get(page, params)
        assert response.status_code == 200
        return sorted(job.handler for job in response.context["cl"].result_list)

    assert handlers() == ["checks.double", "checks.double"]
    assert handlers(engine="shown") == [
        "checks.double",
        "checks.double",
        store.ADVANCE_HANDLER,
        store.ADVANCE_HANDLER,  # the items' batch's then: the run's advance, no hop
    ]
