"""Timeouts, in process: the handler's signal at the deadline, the attempt failed
with JobTimedOut after the grace, the slot given to a fresh thread at once, the
abandoned handler's late result dropped and fenced, async handlers cancelled on their
loop, and no lease renewal past the timeout."""

from __future__ import annotations

import asyncio
import threading

import pytest

from jobs import JobScope, JobStatus, JobSubmission, execution, submit_job
from jobs.exceptions import JobsConfigurationError
from jobs.handlers import RetryPolicy, get_handler
from jobs.models import Job
from jobs.types import AttemptStatus, CancelReason
from jobs.worker import Worker
from tests.support.procs import wait_until

SCOPE = "timeout-tests"
NO_DELAY = RetryPolicy(base_delay=0, jitter=0)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fast(settings):
    settings.JOBS = {
        "POLL_INTERVAL": 0.05,
        "TIMEOUT_GRACE_SECONDS": 0.1,
        "HEARTBEAT_SECONDS": 0.05,
        "LEASE_SECONDS": 30,
    }


class Running:
    """A worker on its own thread, stopped at the end of the test."""

    def __init__(self, **kwargs) -> None:
        self.events: list[tuple[str, str]] = []
        self.worker = Worker(
            listen=False,
            on_event=lambda event, claim, detail: self.events.append(
                (event, claim.job_id if claim else "")
            ),
            **kwargs,
        )
        self.thread = threading.Thread(target=self.worker.run)
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.fixture
def start():
    started: list[Running] = []

    def run(**kwargs) -> Running:
        started.append(Running(**kwargs))
        return started[-1]

    yield run
    for running in started:
        running.stop()


def status(job_id: str) -> JobStatus:
    snap = JobScope(SCOPE).get(job_id)
    assert snap is not None
    return snap.status


def test_a_handler_that_ignores_its_timeout_fails_and_its_slot_runs_the_next_job(
    handler, fast, start
):
    release = threading.Event()
    quick_ran = threading.Event()
    stubborn_threads: list[threading.Thread] = []
    late: list[bool] = []

    @handler("t.stubborn", timeout=0.2)
    def stubborn(ctx):
        stubborn_threads.append(threading.current_thread())
        release.wait(60)  # ignores the signal on purpose
        late.append(ctx.report_progress(50, "too late"))
        return "late result"

    @handler("t.quick")
    def quick(ctx):
        quick_ran.set()
        return "quick"

    submit_job(SCOPE, "stubborn", JobSubmission.create("t.stubborn", priority=1))
    submit_job(SCOPE, "quick", JobSubmission.create("t.quick"))
    running = start(concurrency=1)
    # One slot: the quick job can only run once the stubborn one's slot came back.
    assert quick_ran.wait(30)
    assert not release.is_set()
    assert stubborn_threads[0].is_alive()
    wait_until(lambda: status("quick") == JobStatus.SUCCEEDED, 30, "the quick job")
    snap = JobScope(SCOPE).get("stubborn")
    assert snap.status == JobStatus.FAILED
    assert "JobTimedOut" in snap.error
    assert "timeout of 0.2 s" in snap.error
    assert snap.attempts[0].status == AttemptStatus.FAILED
    assert ("timed-out", "stubborn") in running.events
    # The abandoned handler returns now: its progress and result change nothing.
    release.set()
    stubborn_threads[0].join(30)
    assert late == [False]
    after = JobScope(SCOPE).get("stubborn")
    assert (after.status, after.result_ref, after.progress) == (JobStatus.FAILED, None, None)
    assert running.worker.stats.failed == 1


def test_a_handler_that_stops_at_its_timeout_reads_why_and_is_retried_by_policy(
    handler, fast, start
):
    reasons: list[CancelReason | None] = []

    @handler("t.polite", timeout=0.2, retry=NO_DELAY)
    def polite(ctx):
        if ctx.attempt == 1:
            assert ctx.wait_for_cancel(30)
            reasons.append(ctx.cancel_reason)
            ctx.raise_if_cancelled()
        return "second time"

    submit_job(SCOPE, "polite", JobSubmission.create("t.polite", max_attempts=2))
    start(concurrency=2)
    wait_until(lambda: status("polite") == JobStatus.SUCCEEDED, 30, "the retry to succeed")
    snap = JobScope(SCOPE).get("polite")
    assert reasons == [CancelReason.TIMEOUT]
    assert [a.status for a in snap.attempts] == [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]
    assert "JobTimedOut" in snap.attempts[0].error
    assert snap.result_ref == "second time"


def test_an_async_handler_is_cancelled_on_its_loop_at_the_timeout(handler, settings, start):
    settings.JOBS = {"POLL_INTERVAL": 0.05, "TIMEOUT_GRACE_SECONDS": 60}
    cancelled = threading.Event()

    @handler("t.sleepy", timeout=0.2)
    async def sleepy(ctx):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    submit_job(SCOPE, "sleepy", JobSubmission.create("t.sleepy"))
    start()
    # Far sooner than the 60 s grace: the loop cancelled the coroutine itself.
    wait_until(lambda: status("sleepy") == JobStatus.FAILED, 30, "the async job to fail")
    assert cancelled.wait(30)
    assert "JobTimedOut" in JobScope(SCOPE).get("sleepy").error


def test_the_heartbeat_stops_renewing_a_timed_out_attempts_lease(
    handler, settings, start, monkeypatch
):
    settings.JOBS = {
        "POLL_INTERVAL": 0.05,
        "TIMEOUT_GRACE_SECONDS": 60,
        "HEARTBEAT_SECONDS": 0.05,
        "LEASE_SECONDS": 30,
    }
    release = threading.Event()
    renewed: list[list[str]] = []
    heartbeat = execution.heartbeat

    def recording(tokens, worker_id, **kwargs):
        renewed.append(list(tokens))
        return heartbeat(tokens, worker_id, **kwargs)

    monkeypatch.setattr(execution, "heartbeat", recording)

    @handler("t.hang", timeout=0.3)
    def hang(ctx):
        release.wait(60)

    @handler("t.long", timeout=None)
    def long(ctx):
        release.wait(60)

    submit_job(SCOPE, "hang", JobSubmission.create("t.hang", priority=1))
    submit_job(SCOPE, "long", JobSubmission.create("t.long"))
    running = start(concurrency=2)
    wait_until(lambda: ("timed-out", "hang") in running.events, 30, "the timeout")
    tokens = dict(Job.objects.values_list("job_id", "current_token"))
    assert any(tokens["hang"] in batch for batch in renewed)  # renewed before its timeout
    seen = len(renewed)
    wait_until(lambda: len(renewed) >= seen + 3, 30, "three more heartbeats")
    later = renewed[seen + 1 :]
    assert all(tokens["long"] in batch for batch in later)
    assert not any(tokens["hang"] in batch for batch in later)
    release.set()


def test_timeout_defaults_to_the_setting_and_none_means_none(handler, settings):
    settings.JOBS = {"JOB_TIMEOUT_SECONDS": 30}
    handler("t.default")(lambda ctx: None)
    handler("t.none", timeout=None)(lambda ctx: None)
    handler("t.own", timeout=5)(lambda ctx: None)
    assert get_handler("t.default", 1).timeout_seconds() == 30
    assert get_handler("t.none", 1).timeout_seconds() is None
    assert get_handler("t.own", 1).timeout_seconds() == 5
    for bad in (0, -1, "5", True):
        with pytest.raises(JobsConfigurationError):
            handler("t.bad", timeout=bad)
