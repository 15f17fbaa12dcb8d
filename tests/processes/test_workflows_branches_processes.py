"""Branches and deadlines with real ``run_jobs`` processes: an activity and a child
gathered by one run run at the same time (each sees the other running), and a run's
deadline ends it even when no worker was running when it passed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.utils import timezone

from jobs.models import Job
from jobs.types import JobStatus
from testproject.workflow_checks.models import Effect
from tests.support.procs import WorkerProcess, wait_until
from workflows import RunStatus, WorkflowScope, start_workflow
from workflows.models import WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCOPE = "tenant-branch-procs"
FAST = {"JOBS_POLL_INTERVAL": "0.1", "JOBS_SCHEDULER": "0"}


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        proc = WorkerProcess(tmp_path, *args, env=FAST)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def test_a_gathered_activity_and_child_run_at_the_same_time(workers):
    """Each branch's activity waits until it sees the other one running: gathered
    one after the other (the sum of their times), each would see only itself."""
    start_workflow(SCOPE, "meet-1", "checks.meeting")
    worker = workers("--burst", "--concurrency", "3")
    assert worker.wait(timeout=120) == 0, worker.output
    snap = WorkflowScope(SCOPE).get("meet-1")
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert snap.output == [2, 2]
    assert sorted(Effect.objects.filter(kind="meet").values_list("key", flat=True)) == [
        "activity",
        "child",
    ]


def status(run_id: str) -> RunStatus:
    return WorkflowScope(SCOPE).get(run_id).status


def settled(run_id: str) -> bool:
    """The run and its child wait for their signals, the activity has ended, and no
    job is left but the run's deadline."""
    busy = Job.objects.filter(status__in=(JobStatus.QUEUED, JobStatus.RUNNING)).exclude(
        job_id__endswith=":deadline"
    )
    return (
        WorkflowScope(SCOPE).get(run_id).waiting_for == "signal approved"
        and WorkflowScope(SCOPE).get(f"{run_id}/kid").waiting_for == "signal go"
        and Job.objects.filter(handler="checks.price", status=JobStatus.SUCCEEDED).exists()
        and not busy.exists()
    )


def test_a_deadline_that_passed_while_no_worker_ran_ends_the_run_with_its_child(workers):
    first = workers("--concurrency", "2")
    start_workflow(SCOPE, "warm", "checks.linear", {"start": 1})
    wait_until(lambda: status("warm") == RunStatus.SUCCEEDED, 120, "a first run", first)
    # The worker is up: the run's first advances take well under its ten seconds.
    start_workflow(SCOPE, "late-p", "checks.deadline", timeout=10)
    wait_until(
        lambda: settled("late-p"), 30, "the run and its child to wait for their signals", first
    )
    first.kill()  # SIGKILL: no worker runs while the deadline passes
    deadline = WorkflowRun.objects.get(run_id="late-p").deadline
    wait_until(lambda: timezone.now() > deadline, 30, "the run's deadline to pass")
    assert status("late-p") == RunStatus.WAITING
    again = workers("--burst")
    assert again.wait(timeout=120) == 0, again.output
    late = WorkflowScope(SCOPE).get("late-p")
    assert late.status == RunStatus.CANCELLED
    assert late.error.startswith("RunTimedOut: run 'late-p' did not finish by its deadline")
    assert status("late-p/kid") == RunStatus.CANCELLED
    # The activity had ended; its job is not run again.
    assert Job.objects.get(handler="checks.price").status == JobStatus.SUCCEEDED
