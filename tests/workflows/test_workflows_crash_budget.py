"""The engine's jobs under the jobs' crash budget: a job whose worker keeps dying
ends Interrupted once it reaches ``JOBS["MAX_INTERRUPTIONS"]``, recovered by whichever
process finds it, which sends no ``attempt_finished``. The workflows hear of it at
once (``jobs.signals.job_keeps_killing_worker``): an advance job's run is released to
a new advance, an item job's item ends and its run goes on. If that word is lost
with a process, every worker's upkeep pass ends them, advance jobs as item jobs."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs import JobStatus, execution
from jobs.models import Job
from jobs.signals import job_keeps_killing_worker
from workflows import RunStatus, StepStatus, WaitKind, WorkflowScope, start_workflow, store
from workflows.models import WorkflowItem, WorkflowRun
from workflows.testing import TestClock, run_workflow, run_workflows_inline
from workflows.upkeep import Upkeep

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-crash-budget"


def advance_job(run_pk: int) -> Job:
    return Job.objects.get(
        handler=store.ADVANCE_HANDLER, job_id__startswith=store.advance_job_prefix(run_pk)
    )


def kill_every_try(job: Job, take: object) -> None:
    """Each try of ``job`` starts (its handler does ``take``), then its worker dies
    and another process recovers it, until the crash budget ends the job."""
    while execution.try_start(job.scope_hash, job.job_id, worker_id="doomed") is not None:
        take()  # type: ignore[operator]
        execution.recover_worker("doomed")
    job.refresh_from_db()
    assert job.status == JobStatus.INTERRUPTED
    assert job.keeps_killing_worker


@pytest.fixture
def word_lost():
    """The word of a job that keeps killing its worker lost with a process: the
    workflows' receiver hears nothing."""
    receivers = job_keeps_killing_worker.receivers
    job_keeps_killing_worker.receivers = []
    job_keeps_killing_worker.sender_receivers_cache.clear()
    yield
    job_keeps_killing_worker.receivers = receivers
    job_keeps_killing_worker.sender_receivers_cache.clear()


def test_a_run_whose_advance_job_keeps_killing_its_worker_is_released_at_once():
    start_workflow(SCOPE, "advance-dies", "checks.linear")
    pk = WorkflowRun.objects.get(run_id="advance-dies").pk
    job = advance_job(pk)
    kill_every_try(job, lambda: store.take(pk, job.job_id))
    snap = WorkflowScope(SCOPE).get("advance-dies")
    assert snap.status == RunStatus.WAITING
    assert snap.wait is not None
    assert snap.wait.kind == WaitKind.ADVANCE
    assert snap.waiting_for == "a new advance (the last one failed)"
    assert run_workflow(SCOPE, "advance-dies").status == RunStatus.SUCCEEDED


def test_an_item_whose_job_keeps_killing_its_worker_ends_at_once_and_its_run_goes_on():
    start_workflow(SCOPE, "item-dies", "checks.fanout", {"items": [1]})
    run_workflows_inline(max_attempts_run=1)
    (job,) = Job.objects.filter(handler="checks.double")
    item_pk = WorkflowItem.objects.get().pk
    kill_every_try(
        job, lambda: store.start_item(item_pk, job.scope_hash, job.job_id, timezone.now())
    )
    item = WorkflowItem.objects.get()
    assert (item.status, item.error_type) == (StepStatus.FAILED, "ActivityJobEnded")
    assert item.error.startswith(
        "its job ended Interrupted without recording it: keeps killing its worker"
    )
    snap = run_workflow(SCOPE, "item-dies", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "double"


def test_the_upkeep_releases_a_run_whose_advance_job_ended_unheard(word_lost):
    start_workflow(SCOPE, "advance-unheard", "checks.linear")
    pk = WorkflowRun.objects.get(run_id="advance-unheard").pk
    job = advance_job(pk)
    kill_every_try(job, lambda: store.take(pk, job.job_id))
    assert WorkflowRun.objects.get(pk=pk).status == RunStatus.RUNNING  # nobody heard
    upkeep = Upkeep()
    assert upkeep.end_leftovers_once() is False
    assert upkeep.runs_released == 1
    assert WorkflowRun.objects.get(pk=pk).status == RunStatus.WAITING
    assert upkeep.end_leftovers_once() is False
    assert upkeep.runs_released == 1  # nothing more to release
    assert run_workflow(SCOPE, "advance-unheard").status == RunStatus.SUCCEEDED


def test_the_upkeep_ends_an_item_whose_job_ended_unheard(word_lost):
    start_workflow(SCOPE, "item-unheard", "checks.fanout", {"items": [1]})
    run_workflows_inline(max_attempts_run=1)
    (job,) = Job.objects.filter(handler="checks.double")
    item_pk = WorkflowItem.objects.get().pk
    kill_every_try(
        job, lambda: store.start_item(item_pk, job.scope_hash, job.job_id, timezone.now())
    )
    assert WorkflowItem.objects.get().status == StepStatus.RUNNING  # nobody heard
    upkeep = Upkeep()
    assert upkeep.end_leftovers_once() is False
    assert upkeep.items_ended == 1
    assert WorkflowItem.objects.get().status == StepStatus.FAILED
    assert run_workflow(SCOPE, "item-unheard", clock=TestClock()).status == RunStatus.FAILED


def test_a_running_run_whose_advance_job_still_runs_is_left_to_it():
    start_workflow(SCOPE, "advance-alive", "checks.linear")
    pk = WorkflowRun.objects.get(run_id="advance-alive").pk
    job = advance_job(pk)
    assert execution.try_start(job.scope_hash, job.job_id, worker_id="alive") is not None
    assert store.take(pk, job.job_id) is not None
    upkeep = Upkeep()
    upkeep.end_leftovers_once()
    assert upkeep.runs_released == 0
    run = WorkflowRun.objects.get(pk=pk)
    assert (run.status, run.driver_job) == (RunStatus.RUNNING, job.job_id)
