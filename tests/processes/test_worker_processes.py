"""The worker with real `run_jobs` processes: crash (SIGKILL), restart, SIGTERM, cancellation,
unknown handlers and retries — on SQLite and PostgreSQL."""

from __future__ import annotations

import signal
from datetime import timedelta
from pathlib import Path

import pytest

from jobs import JobScope, JobStatus, JobSubmission, submit_job
from jobs.models import Job, JobAttempt
from jobs.types import AttemptStatus
from testproject.shop.models import WorkLog
from tests.support.procs import WorkerProcess, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCOPE = "process-tests"
FAST_LEASES = {
    "JOBS_LEASE_SECONDS": "2",
    "JOBS_HEARTBEAT_SECONDS": "0.3",
    "JOBS_RECOVERY_INTERVAL": "0.3",
    "JOBS_POLL_INTERVAL": "0.2",
}
#: Crash tests: leases far longer than the test, so only the restarted worker's
#: recovery of its own attempts can take the killed work back.
CRASH_LEASES = {"JOBS_LEASE_SECONDS": "60", "JOBS_HEARTBEAT_SECONDS": "5"}


@pytest.fixture
def workers(tmp_path: Path):
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        proc = WorkerProcess(tmp_path, *args, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def _unfinished() -> int:
    return Job.objects.exclude(status__in=[JobStatus.SUCCEEDED, JobStatus.FAILED]).count()


def test_sigkill_mid_run_loses_nothing_and_restart_recovers_own_attempts(workers, tmp_path):
    """500 jobs, 2 workers; one is killed with SIGKILL while its handlers run, then
    restarted with the same worker id. The lease (60 s) is far longer than the wait,
    so only the restart's recovery of its own attempts can finish the killed work."""
    gate = tmp_path / "gate"
    for n in range(500):
        payload = {"n": n, "hold_file": str(gate)}
        submit_job(SCOPE, f"job-{n}", JobSubmission.create("test.record", payload, max_attempts=3))
    env = {"JOBS_LEASE_SECONDS": "60", "JOBS_HEARTBEAT_SECONDS": "5", "JOBS_POLL_INTERVAL": "0.2"}
    victim = workers("--worker-id", "victim", "--concurrency", "4", env=env)
    survivor = workers("--worker-id", "survivor", "--concurrency", "4", env=env)

    def running(worker_id: str) -> int:
        return JobAttempt.objects.filter(worker_id=worker_id, status=AttemptStatus.RUNNING).count()

    # Both workers are full (their handlers wait at the gate): kill one mid-handler.
    wait_until(lambda: running("victim") == 4, 60, "the victim to run 4 jobs", victim)
    wait_until(lambda: running("survivor") == 4, 60, "the survivor to run 4 jobs", survivor)
    victim.kill()
    assert victim.proc.returncode == -signal.SIGKILL
    gate.touch()
    wait_until(lambda: WorkLog.objects.count() >= 100, 60, "100 jobs done", survivor)
    restarted = workers("--worker-id", "victim", "--concurrency", "4", env=env)
    wait_until(lambda: _unfinished() == 0, 45, "every job to finish", restarted)

    jobs = list(Job.objects.all())
    assert len(jobs) == 500
    assert all(job.status == JobStatus.SUCCEEDED for job in jobs)
    interrupted = JobAttempt.objects.filter(status=AttemptStatus.INTERRUPTED, worker_id="victim")
    assert interrupted.count() == 4
    for job in jobs:
        # Exactly one attempt of the job succeeded, and its side effect exists once.
        assert _effects_of_success(job) == 1
    assert "recovered 4 attempt(s)" in restarted.output


def _effects_of_success(job: Job) -> int:
    """How often the side effect of the one successful attempt of ``job`` was written
    (a run's effect carries its token: every run of a job whose crashes used no attempt
    is its attempt 1)."""
    [success] = job.attempts.filter(status=AttemptStatus.SUCCEEDED)
    return WorkLog.objects.filter(job_id=job.job_id, token=success.token).count()


def _crash_at(workers, point: str, job_id: str) -> Job:
    """One job, a worker killed (SIGKILL) at the first ``point``; the job as it was left."""
    submit_job(SCOPE, job_id, JobSubmission.create("test.record", {}, max_attempts=2))
    first = workers("--worker-id", "w", env={**CRASH_LEASES, "JOBS_FAULT": f"{point}@1:kill"})
    assert first.wait() == -signal.SIGKILL
    job = Job.objects.get(job_id=job_id)
    assert (job.status, job.attempt_count) == (JobStatus.RUNNING, 1)  # the attempt is open
    return job


def _restart_runs_it_once_more(workers, job: Job) -> None:
    """The same worker id restarted in burst mode recovers attempt 1 and runs the job
    again (its attempt row 2; the crash used no attempt)."""
    second = workers("--worker-id", "w", "--burst", env=CRASH_LEASES)
    assert second.wait() == 0, second.output
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert list(job.attempts.values_list("number", "status")) == [
        (1, AttemptStatus.INTERRUPTED),
        (2, AttemptStatus.SUCCEEDED),
    ]
    assert (job.attempt_count, job.interruption_count) == (1, 1)


def test_crash_after_the_handler_committed_its_effect_runs_again_once(workers):
    """Fault point ``jobs.worker.handler_returned``: the handler has committed its side
    effect, and the process dies with SIGKILL before the attempt is completed. The
    restarted worker re-runs the job (at-least-once); the successful attempt's effect
    is recorded exactly once."""
    job = _crash_at(workers, "jobs.worker.handler_returned", "crashy")
    tokens = list(job.attempts.values_list("token", flat=True))
    assert list(WorkLog.objects.values_list("token", flat=True)) == tokens
    _restart_runs_it_once_more(workers, job)
    tokens = list(job.attempts.values_list("token", flat=True))
    assert list(WorkLog.objects.values_list("token", flat=True)) == tokens  # once each


def test_crash_right_after_a_claim_committed_runs_the_job_once_after_restart(workers):
    """Fault point ``jobs.worker.claimed``: the claim committed (attempt 1 Running),
    the handler never started. The restart recovers the attempt and runs the job:
    one effect, from attempt 2."""
    job = _crash_at(workers, "jobs.worker.claimed", "claimed")
    assert not WorkLog.objects.exists()
    _restart_runs_it_once_more(workers, job)
    assert _effects_of_success(job) == WorkLog.objects.count() == 1


def test_crash_right_after_a_settle_committed_keeps_what_it_finished(workers):
    """Fault point ``jobs.worker.settled``: a settle finished returned attempts and
    claimed new ones in one commit, then the process died. What it finished stays
    Succeeded and never runs again; what it claimed is recovered and run by the
    restarted worker; every job ends with exactly one successful attempt whose
    effect exists once."""
    for n in range(40):
        submit_job(SCOPE, f"s{n}", JobSubmission.create("test.record", {}, max_attempts=3))
    fault = {"JOBS_FAULT": "jobs.worker.settled@3:kill"}
    first = workers("--worker-id", "w", "--concurrency", "4", env={**CRASH_LEASES, **fault})
    assert first.wait() == -signal.SIGKILL
    done_before = set(
        Job.objects.filter(status=JobStatus.SUCCEEDED).values_list("job_id", flat=True)
    )
    assert done_before  # the third settle finished what the second one claimed
    running = Job.objects.filter(status=JobStatus.RUNNING).count()
    assert running > 0
    second = workers("--worker-id", "w", "--burst", "--concurrency", "4", env=CRASH_LEASES)
    assert second.wait() == 0, second.output
    assert _unfinished() == 0
    for job in Job.objects.all():
        assert job.status == JobStatus.SUCCEEDED
        assert _effects_of_success(job) == 1
        if job.job_id in done_before:
            assert job.attempt_count == 1  # finished by the settle: never run again
    interrupted = JobAttempt.objects.filter(status=AttemptStatus.INTERRUPTED).count()
    assert interrupted == running


#: Leases renewed every 0.3 s that a heartbeat late by a few seconds (a busy machine)
#: does not lose, swept for every 0.3 s.
SWEPT_LEASES = {**FAST_LEASES, "JOBS_LEASE_SECONDS": "5"}


def test_second_worker_never_robs_a_running_one(workers, tmp_path: Path):
    hold, started = tmp_path / "release", tmp_path / "started"
    payload = {"hold_file": str(hold), "started_file": str(started)}
    submit_job(SCOPE, "long", JobSubmission.create("test.record", payload, max_attempts=3))
    first = workers("--worker-id", "first", env=SWEPT_LEASES)
    wait_until(started.exists, 30, "the handler to start", first)
    claimed_lease = Job.objects.get(job_id="long").lease_expires_at
    second = workers("--worker-id", "second", env=SWEPT_LEASES)
    second.wait_for_output("started")

    # Let the first lease pass twice over while the second worker sweeps for expired
    # leases every 0.3 s: heartbeats must keep the attempt the first one's.
    def renewed_past_first_lease() -> bool:
        lease = Job.objects.get(job_id="long").lease_expires_at
        return lease is not None and lease > claimed_lease + timedelta(seconds=10)

    wait_until(renewed_past_first_lease, 60, "several lease renewals", first)
    hold.touch()
    wait_until(
        lambda: Job.objects.get(job_id="long").status == JobStatus.SUCCEEDED, 30, "success", first
    )
    attempts = list(JobAttempt.objects.filter(job__job_id="long"))
    assert [(a.number, a.status, a.worker_id) for a in attempts] == [
        (1, AttemptStatus.SUCCEEDED, "first")
    ]


@pytest.mark.parametrize("obey", [True, False], ids=["handler-stops", "handler-ignores-signal"])
def test_sigterm_gives_back_running_job_and_next_worker_finishes_it(workers, tmp_path, obey):
    hold, started = tmp_path / "release", tmp_path / "started"
    payload = {"hold_file": str(hold), "started_file": str(started), "obey_cancel": obey}
    submit_job(SCOPE, "long", JobSubmission.create("test.record", payload, max_attempts=3))
    # A handler that stops on its signal gets all the time it needs (it stops at once);
    # one that ignores it, half a second.
    env = {**FAST_LEASES, "JOBS_SHUTDOWN_GRACE_SECONDS": "600" if obey else "0.5"}
    first = workers("--worker-id", "first", "--shutdown-timeout", "0.5", env=env)
    wait_until(started.exists, 30, "the handler to start", first)
    first.signal(signal.SIGTERM)
    assert first.wait() == 0
    job = Job.objects.get(job_id="long")
    assert job.status == JobStatus.QUEUED, first.output
    # A handler that stopped on the shutdown's signal is given back; one that outlived
    # the grace is interrupted and re-queued (the crash budget): neither uses its attempt.
    ended = AttemptStatus.RELEASED if obey else AttemptStatus.INTERRUPTED
    assert list(job.attempts.values_list("status", flat=True)) == [ended]
    assert job.attempt_count == 0

    hold.touch()
    second = workers("--worker-id", "second", "--burst", env=env)
    assert second.wait() == 0
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert list(job.attempts.values_list("number", "status", "worker_id")) == [
        (1, ended, "first"),
        (2, AttemptStatus.SUCCEEDED, "second"),
    ]
    assert list(WorkLog.objects.values_list("attempt", flat=True)) == [1]


def test_cancelling_a_running_job_reaches_the_handler(workers):
    submit_job(SCOPE, "export", JobSubmission.create("demo.export", {"table": "orders"}))
    worker = workers("--worker-id", "w", env=FAST_LEASES)

    def running_with_progress() -> bool:
        job = Job.objects.get(job_id="export")
        return job.status == JobStatus.RUNNING and bool(job.progress)

    wait_until(running_with_progress, 30, "the export to run", worker)
    assert JobScope(SCOPE).cancel("export").value == "requested"
    # The worker checks for cancel requests every 0.5 s by default (and is woken by
    # NOTIFY on PostgreSQL); the bound is only there to fail rather than hang.
    wait_until(
        lambda: Job.objects.get(job_id="export").status == JobStatus.CANCELLED,
        60,
        "the job to end Cancelled",
        worker,
    )
    job = Job.objects.get(job_id="export")
    assert job.result_ref is None
    assert job.attempts.get().status == AttemptStatus.CANCELLED


def test_unknown_handler_is_put_back_then_failed_and_the_worker_goes_on(workers):
    """An old worker puts back a job it has no handler for, without consuming an
    attempt, and runs the others; once the window has passed, a worker fails it
    naming handler and version, and keeps running until SIGTERM."""
    submit_job(SCOPE, "ghost", JobSubmission.create("nope.missing", version=7))
    submit_job(SCOPE, "real", JobSubmission.create("test.record", {}))
    window = {"JOBS_UNKNOWN_HANDLER_RETRY_SECONDS": "3600", "JOBS_UNKNOWN_HANDLER_RETRY_DELAY": "1"}
    old = workers("--burst", env={**FAST_LEASES, **window})
    assert old.wait() == 0, old.output
    assert "put-back job ghost (nope.missing@7)" in old.output
    ghost = JobScope(SCOPE).get("ghost")
    assert ghost is not None
    assert (ghost.status, ghost.attempt_count, ghost.attempts) == (JobStatus.QUEUED, 0, ())
    real = JobScope(SCOPE).get("real")
    assert real is not None
    assert real.status == JobStatus.SUCCEEDED

    # The window has passed for a worker whose setting is 0 s.
    closing = workers(env={**FAST_LEASES, **window, "JOBS_UNKNOWN_HANDLER_RETRY_SECONDS": "0"})
    wait_until(
        lambda: JobScope(SCOPE).get("ghost").status == JobStatus.FAILED,
        30,
        "the ghost job to fail",
        closing,
    )
    ghost = JobScope(SCOPE).get("ghost")
    assert "'nope.missing' version 7" in ghost.error
    assert ghost.attempt_count == 0
    closing.signal(signal.SIGTERM)
    assert closing.wait() == 0, closing.output
    assert "Traceback" not in closing.output


def test_fails_twice_then_succeeds_on_attempt_three(workers):
    sub = JobSubmission.create("demo.flaky", {"fail_times": 2}, max_attempts=3)
    submit_job(SCOPE, "flaky", sub)
    worker = workers("--burst", env=FAST_LEASES)
    assert worker.wait() == 0, worker.output
    snap = JobScope(SCOPE).get("flaky")
    assert snap is not None
    assert snap.status == JobStatus.SUCCEEDED
    assert snap.attempt_count == 3
    assert snap.result_ref == "delivered"
    assert [a.status for a in snap.attempts] == [
        AttemptStatus.FAILED,
        AttemptStatus.FAILED,
        AttemptStatus.SUCCEEDED,
    ]
    for attempt in snap.attempts[:2]:
        assert f"RuntimeError: simulated outage on attempt {attempt.number}" in attempt.error
        assert "Traceback" in attempt.error
