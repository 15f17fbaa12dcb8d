"""The crash budget with real `run_jobs` processes, on SQLite and PostgreSQL: under
the default settings (``max_attempts=1``, ``JOBS["MAX_INTERRUPTIONS"] = 3``) a worker
killed with SIGKILL mid-job, or a shutdown that outlives its grace, uses no attempt:
the job runs again on the next worker. A job that kills its worker every time ends
Interrupted after three runs, named as one that keeps killing its worker."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from jobs import JobScope, JobStatus, JobSubmission, submit_job
from jobs.models import JobAttempt
from jobs.types import AttemptStatus, JobSnapshot
from testproject.shop.models import WorkLog
from tests.processes import test_worker_processes
from tests.processes.test_worker_processes import CRASH_LEASES, SWEPT_LEASES
from tests.support.procs import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCOPE = "crash-budget"

workers = test_worker_processes.workers  # a fixture: run_jobs processes


def _held_job(tmp_path: Path, job_id: str, **payload: object) -> tuple[Path, Path]:
    """A job with the default ``max_attempts`` whose handler says it started (a file)
    and then holds until the test lets it go (another file)."""
    hold, started = tmp_path / f"{job_id}-hold", tmp_path / f"{job_id}-started"
    payload = {"hold_file": str(hold), "started_file": str(started), **payload}
    submit_job(SCOPE, job_id, JobSubmission.create("test.record", payload))
    return hold, started


def _job(job_id: str) -> JobSnapshot:
    snap = JobScope(SCOPE).get(job_id)
    assert snap is not None
    return snap


def test_a_worker_killed_mid_job_leaves_the_job_to_the_next_worker(workers, tmp_path):
    """SIGKILL while the handler runs; another worker recovers the attempt once its
    lease expired, and the job succeeds there: the crash used no attempt."""
    hold, started = _held_job(tmp_path, "killed")
    first = workers("--worker-id", "first", env=SWEPT_LEASES)
    wait_until(started.exists, 60, "the handler to start", first)
    first.kill()
    assert first.proc.returncode == -signal.SIGKILL
    hold.touch()
    second = workers("--worker-id", "second", env=SWEPT_LEASES)
    wait_until(
        lambda: _job("killed").status == JobStatus.SUCCEEDED,
        60,
        "the job to succeed on the next worker",
        second,
    )
    snap = _job("killed")
    assert (snap.attempt_count, snap.max_attempts, snap.interruption_count) == (1, 1, 1)
    assert not snap.keeps_killing_worker
    assert [(a.number, a.status, a.worker_id) for a in snap.attempts] == [
        (1, AttemptStatus.INTERRUPTED, "first"),
        (2, AttemptStatus.SUCCEEDED, "second"),
    ]
    # The killed run never reached its effect; the second one wrote it once.
    assert list(WorkLog.objects.values_list("job_id", "token")) == [("killed", _token_of(snap, 2))]


def test_a_job_that_kills_its_worker_every_time_ends_interrupted_after_three_runs(
    workers, tmp_path
):
    """Each run kills its worker (SIGKILL as soon as the handler started). The
    worker restarted under the same id recovers the attempt at once and runs the job
    again; the third interruption reaches the budget: the job ends Interrupted as one
    that keeps killing its worker, and the log says so."""
    _hold, started = _held_job(tmp_path, "poison")
    for run in range(1, 4):
        started.unlink(missing_ok=True)
        worker = workers("--worker-id", "w", env=CRASH_LEASES)
        wait_until(started.exists, 60, f"run {run} of the handler to start", worker)
        worker.kill()
    last = workers("--worker-id", "w", "--burst", env=CRASH_LEASES)
    assert last.wait() == 0, last.output
    snap = _job("poison")
    assert snap.status == JobStatus.INTERRUPTED
    assert snap.keeps_killing_worker
    assert (snap.attempt_count, snap.interruption_count) == (0, 3)
    assert [(a.number, a.status, a.worker_id) for a in snap.attempts] == [
        (n, AttemptStatus.INTERRUPTED, "w") for n in (1, 2, 3)
    ]
    assert "keeps killing its worker" in snap.error
    assert "job poison keeps killing its worker" in last.output
    assert not WorkLog.objects.exists()


def test_a_shutdown_that_outlives_its_grace_requeues_without_using_the_attempt(workers, tmp_path):
    """SIGTERM; the handler ignores the shutdown's signal past the timeout and the
    grace. The worker recovers the attempt as it exits: Queued again with its one
    attempt unused, and the next worker runs it to success."""
    hold, started = _held_job(tmp_path, "stubborn", obey_cancel=False)
    env = {**SWEPT_LEASES, "JOBS_SHUTDOWN_GRACE_SECONDS": "0.5"}
    first = workers("--worker-id", "first", "--shutdown-timeout", "0.5", env=env)
    wait_until(started.exists, 60, "the handler to start", first)
    first.signal(signal.SIGTERM)
    assert first.wait() == 0, first.output
    snap = _job("stubborn")
    assert (snap.status, snap.attempt_count) == (JobStatus.QUEUED, 0), first.output
    assert snap.interruption_count == 1
    assert [a.status for a in snap.attempts] == [AttemptStatus.INTERRUPTED]

    hold.touch()
    second = workers("--worker-id", "second", "--burst", env=env)
    assert second.wait() == 0, second.output
    snap = _job("stubborn")
    assert (snap.status, snap.attempt_count) == (JobStatus.SUCCEEDED, 1)
    assert [(a.number, a.status, a.worker_id) for a in snap.attempts] == [
        (1, AttemptStatus.INTERRUPTED, "first"),
        (2, AttemptStatus.SUCCEEDED, "second"),
    ]


def _token_of(snap: JobSnapshot, number: int) -> str:
    """The token of attempt ``number`` of ``snap``, read from its attempt row."""
    return JobAttempt.objects.get(job__job_id=snap.job_id, number=number).token
