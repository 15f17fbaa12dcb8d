"""A failed try of an activity is a failed attempt of its item's job: its error, its
retry (the activity's back-off), its metric; the last try's failure fails the job
and records the item's. Kills and outages do not fail an item by themselves, and an
item whose job ended without recording it still ends. A failed run leaves a
WARNING in the worker's log."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError
from django.utils import timezone

from jobs import JobScope, JobStatus, execution
from jobs.exceptions import UnknownHandler
from jobs.flow_control import Limits
from jobs.handlers import PermanentFailure, get_handler
from jobs.models import Job, JobAttempt
from jobs.signals import attempt_finished, finished_attempt
from jobs.testing import run_jobs_inline
from jobs.types import AttemptStatus, FinishOutcome
from tests.support.workflows import later_clock
from workflows import (
    RunStatus,
    StepStatus,
    WorkflowContext,
    WorkflowScope,
    activity,
    start_workflow,
    store,
    workflow,
)
from workflows.engine import Advanced, advance
from workflows.exceptions import InvalidWorkflow
from workflows.models import WorkflowItem, WorkflowRun
from workflows.testing import TestClock, run_workflow, run_workflows_inline
from workflows.upkeep import Upkeep

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-item-failures"
#: Tries per value of ``itemfail.flaky`` (its first ``value`` tries fail).
TRIES: dict[int, int] = {}


@activity("itemfail.lookup", retries=1)
def lookup(key: str) -> str:
    return {"known": "value"}[key]


@activity("itemfail.flaky", retries=3)
def flaky(value: int) -> int:
    TRIES[value] = tries = TRIES.get(value, 0) + 1
    if tries <= value:
        raise ConnectionError(f"try {tries} of {value} failed")
    return tries


@activity("itemfail.refuse", retries=5)
def refuse(value: int) -> int:
    raise PermanentFailure(f"{value} is never valid")


@workflow("itemfail.lookups", version=1)
def lookups(wf: WorkflowContext) -> Any:
    return wf.map("lookup", lookup, wf.input)


@workflow("itemfail.flakies", version=1)
def flakies(wf: WorkflowContext) -> Any:
    return wf.map("flaky", flaky, wf.input)


@workflow("itemfail.refusals", version=1)
def refusals(wf: WorkflowContext) -> Any:
    return wf.step("refuse", refuse, 1)


def item_jobs(handler: str) -> list[Job]:
    return list(Job.objects.filter(handler=handler).order_by("job_id"))


def attempt_statuses(job: Job) -> list[str]:
    return list(
        JobAttempt.objects.filter(job=job).order_by("number").values_list("status", flat=True)
    )


def test_a_failing_activity_fails_its_job_attempts_with_their_error():
    start_workflow(SCOPE, "lookup-1", "itemfail.lookups", ["known", "missing"])
    snap = run_workflow(SCOPE, "lookup-1", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("StepFailed: step 'lookup' failed: KeyError: 1 of 2 items")
    succeeded, failed = sorted(
        item_jobs("itemfail.lookup"), key=lambda job: job.status != "succeeded"
    )
    assert (succeeded.status, attempt_statuses(succeeded)) == (JobStatus.SUCCEEDED, ["succeeded"])
    # Two tries (retries=1): two failed attempts, the job Failed with the KeyError.
    assert failed.status == JobStatus.FAILED
    assert attempt_statuses(failed) == [AttemptStatus.FAILED, AttemptStatus.FAILED]
    assert failed.attempt_count == failed.max_attempts == 2
    assert "KeyError: 'missing'" in failed.error
    assert failed.progress is None  # not "100 %": it did not succeed
    errors = JobAttempt.objects.filter(job=failed).values_list("error", flat=True)
    assert all("KeyError: 'missing'" in error for error in errors)
    # The jobs admin's Failed filter (and the scope's own list) finds it.
    assert [job.job_id for job in JobScope(SCOPE).list(status="failed")] == [failed.job_id]
    item = WorkflowItem.objects.get(job_id=failed.job_id)
    assert (item.status, item.error_type, item.attempts) == ("failed", "KeyError", 2)


def test_every_failed_try_is_a_failed_attempt_for_the_metrics():
    seen: list[tuple[FinishOutcome, bool]] = []

    def record(sender: Any, *, claim: Any, outcome: Any, retry_scheduled: bool, **_: Any) -> None:
        if claim.handler == "itemfail.lookup":
            seen.append((outcome, retry_scheduled))

    attempt_finished.connect(record)
    try:
        start_workflow(SCOPE, "lookup-2", "itemfail.lookups", ["missing"])
        run_workflow(SCOPE, "lookup-2", clock=TestClock())
    finally:
        attempt_finished.disconnect(record)
    # The first try: failed, a retry scheduled; the second: failed for good.
    assert seen == [(FinishOutcome.REQUEUED, True), (FinishOutcome.FAILED, False)]


def test_an_activitys_retries_are_its_jobs_attempts_with_its_back_off(settings):
    settings.WORKFLOWS = {"RETRY_BASE_DELAY": 7.0, "RETRY_MAX_DELAY": 20.0}
    TRIES.clear()
    start_workflow(SCOPE, "flaky-1", "itemfail.flakies", [3])
    clock = later_clock()
    runs = run_workflows_inline(clock=clock)
    (job,) = item_jobs("itemfail.flaky")
    assert job.max_attempts == 4  # retries=3
    assert job.status == JobStatus.QUEUED
    assert job.next_run_at == clock.now + timedelta(seconds=7)
    assert [run.outcome for run in runs if run.handler == "itemfail.flaky"] == [
        FinishOutcome.REQUEUED
    ]
    clock.advance(7)
    run_workflows_inline(clock=clock)
    assert Job.objects.get(pk=job.pk).next_run_at == clock.now + timedelta(seconds=14)
    clock.advance(14)
    run_workflows_inline(clock=clock)
    # Doubled each try (RETRY_BACKOFF_FACTOR), at most RETRY_MAX_DELAY.
    assert Job.objects.get(pk=job.pk).next_run_at == clock.now + timedelta(seconds=20)
    snap = run_workflow(SCOPE, "flaky-1", clock=clock)
    assert snap.output == [4]
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert attempt_statuses(job) == ["failed", "failed", "failed", "succeeded"]
    assert snap.step("flaky").attempts == 4


def test_a_permanent_failure_of_an_activity_is_not_retried():
    start_workflow(SCOPE, "refuse-1", "itemfail.refusals")
    snap = run_workflow(SCOPE, "refuse-1", clock=TestClock())
    assert snap.error.startswith("StepFailed: step 'refuse' failed: PermanentFailure: 1 is never")
    (job,) = item_jobs("itemfail.refuse")
    assert (job.status, job.attempt_count, job.max_attempts) == (JobStatus.FAILED, 1, 6)


def time_out_every_try(run_id: str, *, heard: bool) -> None:
    """Each try of the run's one item job is failed by its worker's timeout watch
    (``JobTimedOut``), the last for good; ``heard``: the worker says so
    (``attempt_finished``), else it died before it could."""
    start_workflow(SCOPE, run_id, "itemfail.lookups", ["known"])
    pk = WorkflowRun.objects.get(run_id=run_id).pk
    assert advance(pk) is Advanced.WAITING  # the first advance: one item job
    prefix = f"{store.ITEM_JOB_PREFIX}{pk}."
    (job,) = Job.objects.filter(handler="itemfail.lookup", job_id__startswith=prefix)
    for attempt in (1, 2):
        claim = execution.try_start(job.scope_hash, job.job_id, worker_id="w")
        assert claim is not None
        retry_at = timezone.now() if attempt == 1 else None
        outcome = execution.fail(claim.token, "JobTimedOut: past its timeout", retry_at=retry_at)
        if heard:
            finished_attempt(claim, outcome, retry_scheduled=outcome is FinishOutcome.REQUEUED)


def test_an_item_whose_job_ended_reads_the_same_whoever_heard_of_it():
    """One rule for an item whose job ended without recording it: the worker's word
    of the job's end wrote ``ActivityJobFailed`` and the job's last error on the
    item, while the fan-in (or the upkeep) that found the job ended without that
    word wrote ``ActivityJobEnded``, its message another: the same failure read two
    ways depending on whether a process died in between."""
    time_out_every_try("heard-1", heard=True)
    time_out_every_try("unheard-1", heard=False)
    heard = run_workflow(SCOPE, "heard-1", clock=TestClock())
    unheard = run_workflow(SCOPE, "unheard-1", clock=TestClock())
    assert heard.status == unheard.status == RunStatus.FAILED
    assert heard.error.split("\n")[0] == unheard.error.split("\n")[0]
    ended = WorkflowItem.objects.order_by("pk").values_list("status", "error_type", "error")
    assert len(set(ended)) == 1, list(ended)


def test_a_try_past_its_timeout_fails_and_the_last_one_ends_its_item():
    start_workflow(SCOPE, "slow-1", "itemfail.lookups", ["known"])
    run_workflows_inline(max_attempts_run=1)  # the advance: one item job
    (job,) = item_jobs("itemfail.lookup")
    for attempt in (1, 2):
        claim = execution.try_start(job.scope_hash, job.job_id, worker_id="w")
        assert claim is not None
        assert claim.attempt == attempt
        # The worker's timeout watch fails the attempt (JobTimedOut), retried by policy.
        retry_at = timezone.now() if attempt == 1 else None
        outcome = execution.fail(claim.token, "JobTimedOut: past its timeout", retry_at=retry_at)
        finished_attempt(claim, outcome, retry_scheduled=outcome is FinishOutcome.REQUEUED)
    item = WorkflowItem.objects.get(job_id=job.job_id)
    assert (item.status, item.error_type) == ("failed", "ActivityJobEnded")
    assert item.error == "its job ended Failed without recording it: JobTimedOut: past its timeout"
    snap = run_workflow(SCOPE, "slow-1", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert "ActivityJobEnded: its job ended Failed without recording it: JobTimedOut" in snap.error


def test_an_item_whose_job_keeps_dying_ends_once_its_job_ends_interrupted():
    start_workflow(SCOPE, "dying-1", "itemfail.lookups", ["known"])
    run_workflows_inline(max_attempts_run=1)
    (job,) = item_jobs("itemfail.lookup")
    # Each try's worker is killed; recovery queues the job again under the crash
    # budget. Once the budget is spent the job ends Interrupted, recovered by another
    # process (no attempt_finished): its word that the job keeps killing its worker
    # ends the item at once (the upkeep's pass would, if that word were lost).
    while execution.try_start(job.scope_hash, job.job_id, worker_id="doomed") is not None:
        store.start_item(WorkflowItem.objects.get().pk, job.scope_hash, job.job_id, timezone.now())
        execution.recover_worker("doomed")
    job.refresh_from_db()
    assert job.status == JobStatus.INTERRUPTED
    assert Upkeep().end_leftovers_once() is False  # nothing left for the upkeep
    item = WorkflowItem.objects.get()
    assert (item.status, item.error_type) == ("failed", "ActivityJobEnded")
    assert item.error.startswith(
        "its job ended Interrupted without recording it: keeps killing its worker"
    )
    snap = run_workflow(SCOPE, "dying-1", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.step("lookup").status == StepStatus.FAILED


def test_an_outage_while_the_item_is_read_uses_no_attempt(monkeypatch):
    # A job without its seal (staged by an older version) reads its item from the
    # database: the connection is lost there.
    real = store.start_item
    outages = [OperationalError("the database went away")]

    def start_item(*args: Any, **kwargs: Any) -> Any:
        if outages:
            raise outages.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "sealed_item", lambda *args: None)
    monkeypatch.setattr(store, "start_item", start_item)
    start_workflow(SCOPE, "outage-1", "itemfail.lookups", ["known"])
    clock = later_clock()
    runs = run_workflows_inline(clock=clock)
    assert [run.outcome for run in runs if run.handler == "itemfail.lookup"] == [
        FinishOutcome.SNOOZED
    ]
    snap = run_workflow(SCOPE, "outage-1", clock=clock)
    assert snap.output == ["value"]
    (job,) = item_jobs("itemfail.lookup")
    assert (job.status, job.attempt_count) == (JobStatus.SUCCEEDED, 1)


def test_a_job_run_again_after_its_item_failed_runs_nothing_and_fails():
    start_workflow(SCOPE, "again-1", "itemfail.lookups", ["missing"])
    run_workflow(SCOPE, "again-1", clock=TestClock())
    (job,) = item_jobs("itemfail.lookup")
    JobScope(SCOPE).retry(job.job_id, extra_attempts=1)
    (ran,) = run_jobs_inline(now=timezone.now() + timedelta(hours=1))
    assert ran.outcome is FinishOutcome.FAILED
    assert "PermanentFailure: item 0 ended failed already (KeyError" in ran.error
    assert WorkflowItem.objects.get().attempts == 2  # no try counted


def test_a_failed_run_leaves_a_warning_naming_it_in_the_workers_log(caplog):
    start_workflow(SCOPE, "lookup-log", "itemfail.lookups", ["missing"])
    with caplog.at_level(logging.WARNING, logger="workflows.engine"):
        run_workflow(SCOPE, "lookup-log", clock=TestClock())
    (record,) = [r for r in caplog.records if r.name == "workflows.engine"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "workflow itemfail.lookups run lookup-log failed at step 'lookup': StepFailed: "
        "step 'lookup' failed: KeyError: 'missing'"
    )
    assert (record.workflow, record.workflow_version, record.run_id, record.step) == (  # type: ignore[attr-defined]
        "itemfail.lookups",
        1,
        "lookup-log",
        "lookup",
    )
    assert record.scope_hash == JobScope(SCOPE).scope_hash  # type: ignore[attr-defined]
    assert record.error.startswith("StepFailed: step 'lookup' failed")  # type: ignore[attr-defined]
    assert WorkflowScope(SCOPE).get("lookup-log").status == RunStatus.FAILED


def test_an_activity_sets_its_item_jobs_limits():
    @activity("itemfail.limited", max_running=2, max_running_per_scope=1, rate=(10, 60.0))
    def limited(value: int) -> int:
        return value

    spec = get_handler("itemfail.limited", 1)
    assert spec.limits == Limits(max_running=2, max_running_per_scope=1, rate=(10, 60.0))
    with pytest.raises(InvalidWorkflow, match=r"itemfail\.bad_limit"):
        activity("itemfail.bad_limit", max_running=0)(lambda value: value)
    with pytest.raises(UnknownHandler):  # its handler was never registered
        get_handler("itemfail.bad_limit", 1)
