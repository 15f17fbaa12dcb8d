"""The engine's jobs under the jobs' crash budget: a job whose worker keeps dying
ends Interrupted once it reaches ``JOBS["MAX_INTERRUPTIONS"]``, recovered by whichever
process finds it, which sends no ``attempt_finished``. The workflows hear of it at
once (``jobs.signals.job_keeps_killing_worker``): an advance job's run ends Failed
with ``KeepsKillingWorker`` (a new advance would only run the same step and kill
its worker again, for ever), an item job's item ends and its run goes on. If that
word is lost with a process, every worker's upkeep pass ends them, advance jobs as
item jobs."""

from __future__ import annotations

import logging

import pytest
from django.utils import timezone

from jobs import JobStatus, execution
from jobs.models import Job
from jobs.signals import job_keeps_killing_worker
from workflows import RunStatus, StepKind, StepStatus, WorkflowScope, start_workflow, store
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


def test_a_run_whose_advance_job_keeps_killing_its_worker_fails_at_once(caplog):
    """Released to a new advance, the run ran the same step again, which killed its
    worker again: the crash budget started over with each new advance job, and the
    run never ended. It ends Failed at once instead, saying so, and a resume (once
    the cause is fixed) advances it again."""
    start_workflow(SCOPE, "advance-dies", "checks.linear")
    pk = WorkflowRun.objects.get(run_id="advance-dies").pk
    job = advance_job(pk)
    with caplog.at_level(logging.WARNING, logger="workflows.engine"):
        kill_every_try(job, lambda: store.take(pk, job.job_id))
    snap = WorkflowScope(SCOPE).get("advance-dies")
    assert snap.status == RunStatus.FAILED, snap.waiting_for
    assert snap.failed_step == ""
    assert snap.error.startswith(
        f"KeepsKillingWorker: the run's advance job {job.job_id} kept killing its worker"
    )
    assert "before its first checkpoint" in snap.error
    assert snap.finished_at is not None
    # No new advance job: nothing would run the same step again.
    assert [j.job_id for j in Job.objects.filter(handler=store.ADVANCE_HANDLER)] == [job.job_id]
    (line,) = [r for r in caplog.records if r.name == "workflows.engine"]
    assert line.run_id == "advance-dies"
    assert line.error.startswith("KeepsKillingWorker: ")
    WorkflowScope(SCOPE).resume("advance-dies")
    assert run_workflow(SCOPE, "advance-dies").status == RunStatus.SUCCEEDED


def test_the_error_names_the_last_checkpoint_the_run_recorded():
    start_workflow(SCOPE, "dies-later", "checks.linear")
    run = WorkflowRun.objects.get(run_id="dies-later")
    job = advance_job(run.pk)

    def take_and_record_a() -> None:
        driver = store.take(run.pk, job.job_id)
        assert driver is not None
        if not run.steps.exists():
            store.record_step(
                driver,
                None,
                "a",
                StepKind.STEP,
                StepStatus.SUCCEEDED,
                timezone.now(),
                attempts=1,
                result_json="4",
            )

    kill_every_try(job, take_and_record_a)
    snap = WorkflowScope(SCOPE).get("dies-later")
    assert snap.status == RunStatus.FAILED
    assert "after its checkpoint 'a'" in snap.error


def test_a_run_whose_cancel_was_asked_ends_cancelled_instead():
    start_workflow(SCOPE, "dies-cancelled", "checks.linear")
    pk = WorkflowRun.objects.get(run_id="dies-cancelled").pk
    job = advance_job(pk)

    def take_then_cancel() -> None:
        assert store.take(pk, job.job_id) is not None
        WorkflowScope(SCOPE).cancel("dies-cancelled")

    kill_every_try(job, take_then_cancel)
    snap = WorkflowScope(SCOPE).get("dies-cancelled")
    assert (snap.status, snap.error) == (RunStatus.CANCELLED, "cancelled on request")


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


def test_the_upkeep_fails_a_run_whose_advance_job_ended_unheard(word_lost):
    start_workflow(SCOPE, "advance-unheard", "checks.linear")
    pk = WorkflowRun.objects.get(run_id="advance-unheard").pk
    job = advance_job(pk)
    kill_every_try(job, lambda: store.take(pk, job.job_id))
    assert WorkflowRun.objects.get(pk=pk).status == RunStatus.RUNNING  # nobody heard
    upkeep = Upkeep()
    assert upkeep.end_leftovers_once() is False
    assert upkeep.runs_let_go == 1
    snap = WorkflowScope(SCOPE).get("advance-unheard")
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("KeepsKillingWorker: ")
    assert upkeep.end_leftovers_once() is False
    assert upkeep.runs_let_go == 1  # nothing more to let go


def test_the_upkeep_releases_a_run_whose_advance_job_failed_unheard(word_lost):
    """An advance job whose tries all failed on an outage (not the run's fault) lets
    go of its run to a new advance."""
    start_workflow(SCOPE, "advance-outage", "checks.linear")
    pk = WorkflowRun.objects.get(run_id="advance-outage").pk
    job = advance_job(pk)
    claim = execution.try_start(job.scope_hash, job.job_id, worker_id="w")
    assert claim is not None
    assert store.take(pk, job.job_id) is not None
    execution.fail(claim.token, "OperationalError: the database went away", retry_at=None)
    upkeep = Upkeep()
    assert upkeep.end_leftovers_once() is False
    assert upkeep.runs_let_go == 1
    snap = WorkflowScope(SCOPE).get("advance-outage")
    assert snap.status == RunStatus.WAITING
    assert snap.waiting_for == "a new advance (the last one failed)"
    assert run_workflow(SCOPE, "advance-outage").status == RunStatus.SUCCEEDED


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
    assert upkeep.runs_let_go == 0
    run = WorkflowRun.objects.get(pk=pk)
    assert (run.status, run.driver_job) == (RunStatus.RUNNING, job.job_id)
