"""A routine deploy never destroys a job: ``run_jobs`` stopped by SIGTERM while a
handler runs gives the claim back (released: Queued again, its attempt unused) when
the handler stops on the shutdown signal, and the next worker runs it — with the
default single attempt, on SQLite and PostgreSQL, as real processes."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs import JobStatus, JobSubmission, submit_job
from jobs.models import Job
from jobs.types import AttemptStatus
from tests.support.procs import ManageProcess, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

QUICK = {
    "JOBS_POLL_INTERVAL": "0.05",
    "JOBS_HEARTBEAT_SECONDS": "0.5",
    "JOBS_LEASE_SECONDS": "30",
}


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    started: list[ManageProcess] = []

    def start(command: str, *args: str, env: dict[str, str] | None = None) -> ManageProcess:
        proc = ManageProcess(tmp_path, command, *args, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def test_sigterm_releases_a_running_job_and_the_next_worker_runs_it(spawn, tmp_path):
    hold, started = tmp_path / "hold", tmp_path / "started"
    payload = {"hold_file": str(hold), "started_file": str(started), "obey_cancel": True}
    submit_job("deploy", "report", JobSubmission.create("test.record", payload))
    worker = spawn("run_jobs", "--shutdown-timeout", "2", env=QUICK)
    wait_until(started.exists, 60, "the handler to start", worker)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output
    output = worker.output
    # The signal is announced before the worker says how long it waits.
    announced = output.index("SIGTERM, stopping gracefully")
    assert announced < output.index("waiting up to 2.0s"), output
    assert "released job report" in output, output
    assert "released 1" in output, output
    assert "re-queued 0" in output, output
    job = Job.objects.get(job_id="report")
    assert (job.status, job.attempt_count, job.max_attempts) == (JobStatus.QUEUED, 0, 1)
    assert list(job.attempts.values_list("status", flat=True)) == [AttemptStatus.RELEASED]

    hold.touch()
    after = spawn("run_jobs", "--burst", env=QUICK)
    assert after.wait(60) == 0, after.output
    job.refresh_from_db()
    assert (job.status, job.attempt_count) == (JobStatus.SUCCEEDED, 1)
    assert list(job.attempts.order_by("number").values_list("status", flat=True)) == [
        AttemptStatus.RELEASED,
        AttemptStatus.SUCCEEDED,
    ]
