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
    # The handlers stop on the shutdown's signal: they are given back because they
    # did, however long a busy machine takes them to.
    "JOBS_SHUTDOWN_GRACE_SECONDS": "600",
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


# --------------------------------------------------------------------------- look-ahead

FAST_LEASES = {
    "JOBS_LEASE_SECONDS": "2",
    "JOBS_HEARTBEAT_SECONDS": "0.3",
    "JOBS_RECOVERY_INTERVAL": "0.3",
    "JOBS_POLL_INTERVAL": "0.05",
}
#: One look-ahead job for two slots, never given back for waiting while the test runs;
#: handlers that stop on the shutdown's signal, waited for as long as they take.
LOOKAHEAD = {
    "JOBS_PREFETCH": "1",
    "JOBS_PREFETCH_MAX_WAIT": "600",
    "JOBS_SHUTDOWN_GRACE_SECONDS": "600",
}


def _held_jobs(tmp_path: Path, n: int, **kwargs: Any) -> tuple[Path, list[Path]]:
    hold = tmp_path / "hold"
    started = [tmp_path / f"started-{i}" for i in range(n)]
    for i in range(n):
        payload = {"hold_file": str(hold), "started_file": str(started[i]), "obey_cancel": True}
        submit_job("ahead", f"a{i}", JobSubmission.create("test.record", payload, **kwargs))
    return hold, started


def _running() -> int:
    return Job.objects.filter(status=JobStatus.RUNNING).count()


def test_sigterm_releases_lookahead_jobs_without_using_attempts(spawn, tmp_path):
    hold, started = _held_jobs(tmp_path, 4)
    env = {**FAST_LEASES, **LOOKAHEAD}
    worker = spawn("run_jobs", "--concurrency", "2", "--shutdown-timeout", "0", env=env)
    wait_until(lambda: sum(p.exists() for p in started) == 2, 60, "both handlers", worker)
    wait_until(lambda: _running() == 3, 60, "two running and one looked ahead", worker)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output
    assert "released 3" in worker.output, worker.output
    assert not Job.objects.exclude(status=JobStatus.QUEUED).exists()
    assert set(Job.objects.values_list("attempt_count", flat=True)) == {0}

    hold.touch()
    after = spawn("run_jobs", "--burst", "--concurrency", "2", env=env)
    assert after.wait(60) == 0, after.output
    assert Job.objects.filter(status=JobStatus.SUCCEEDED, attempt_count=1).count() == 4


def test_a_killed_worker_s_lookahead_jobs_are_recovered_by_lease(spawn, tmp_path):
    """kill -9 while it holds two running jobs and one looked ahead: another worker
    recovers all three when their leases expire, like any Running job, and runs them."""
    hold, started = _held_jobs(tmp_path, 4, max_attempts=3)
    env = {**FAST_LEASES, **LOOKAHEAD}
    first = spawn("run_jobs", "--concurrency", "2", "--worker-id", "first", env=env)
    wait_until(lambda: sum(p.exists() for p in started) == 2, 60, "both handlers", first)
    wait_until(lambda: _running() == 3, 60, "two running and one looked ahead", first)
    held = set(Job.objects.filter(status=JobStatus.RUNNING).values_list("job_id", flat=True))
    assert set(Job.objects.filter(leased_by="first").values_list("job_id", flat=True)) == held
    first.kill()

    hold.touch()
    second = spawn("run_jobs", "--concurrency", "2", "--worker-id", "second", env=env)
    wait_until(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 4,
        60,
        "every job to succeed",
        second,
    )
    for job in Job.objects.filter(job_id__in=held):
        statuses = list(job.attempts.order_by("number").values_list("status", "worker_id"))
        assert statuses == [
            (AttemptStatus.INTERRUPTED, "first"),
            (AttemptStatus.SUCCEEDED, "second"),
        ], statuses
