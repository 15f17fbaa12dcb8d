"""Branches and deadlines with real ``run_jobs`` processes: an activity and a child
gathered by one run run at the same time (each sees the other running), and a run's
deadline ends it even when no worker was running when it passed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testproject.workflow_checks.models import Effect
from tests.support.procs import WorkerProcess
from workflows import RunStatus, WorkflowScope, start_workflow

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
