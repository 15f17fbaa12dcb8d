"""In process: ``async def`` handlers run on the worker's event loop with no thread of
their own, and keep the contract of plain ones — their timeout (cancelled on the
loop, failed after the grace without retiring a thread), the shutdown's release,
and their failures' retries."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from jobs import JobScope, JobStatus, JobSubmission, submit_job
from jobs.handlers import RetryPolicy
from jobs.types import AttemptStatus
from jobs.worker import Worker
from tests.support.procs import wait_until

SCOPE = "async-handler-tests"

pytestmark = pytest.mark.django_db(transaction=True)


def status(job_id: str) -> JobStatus:
    snap = JobScope(SCOPE).get(job_id)
    assert snap is not None
    return snap.status


def test_async_handlers_run_together_on_the_loop_without_a_thread_each(handler):
    """Eight coroutines that each wait until all eight run: they can only succeed if
    the worker runs them at once; and the worker did so on fewer threads than that."""
    together = 8
    arrived: list[str] = []
    all_in: dict[str, asyncio.Event] = {}

    @handler("a.together")
    async def run(ctx):
        everyone = all_in.setdefault("event", asyncio.Event())  # one loop: no race
        arrived.append(ctx.job_id)
        if len(arrived) == together:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 30)
        return "met"

    for n in range(together):
        submit_job(SCOPE, f"j{n}", JobSubmission.create("a.together"))
    worker = Worker(burst=True, listen=False, concurrency=together)
    stats = worker.run()
    assert stats.succeeded == together
    assert {status(f"j{n}") for n in range(together)} == {JobStatus.SUCCEEDED}
    assert JobScope(SCOPE).get("j0").result_ref == "met"
    assert len(worker.slots.threads) < together


def test_an_async_handler_past_its_grace_is_failed_and_no_thread_retired(handler, settings):
    """A coroutine that swallows the cancellation of its timeout is failed after the
    grace, as a plain handler would be; it held no thread, so none is retired or
    replaced, and what it does later is fenced off and dropped."""
    settings.JOBS = {"POLL_INTERVAL": 0.05, "TIMEOUT_GRACE_SECONDS": 0.1}
    release = threading.Event()
    quick_threads: list[str] = []
    late: list[bool] = []

    @handler("a.stubborn", timeout=0.2)
    async def stubborn(ctx):
        with contextlib.suppress(asyncio.CancelledError):  # ignored on purpose
            await asyncio.sleep(60)
        await asyncio.to_thread(release.wait, 60)
        late.append(await ctx.areport_progress(50, "too late"))
        return "late result"

    @handler("a.quick")
    def quick(ctx):
        quick_threads.append(threading.current_thread().name)
        return "quick"

    submit_job(SCOPE, "stubborn", JobSubmission.create("a.stubborn", priority=1))
    submit_job(SCOPE, "quick", JobSubmission.create("a.quick"))
    worker = Worker(listen=False, concurrency=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        # One slot: the quick job runs once the stubborn one's place came back.
        wait_until(lambda: status("quick") == JobStatus.SUCCEEDED, 30, "the quick job")
        snap = JobScope(SCOPE).get("stubborn")
        assert snap.status == JobStatus.FAILED
        assert "JobTimedOut" in snap.error
        assert "did not stop within the grace" in snap.error
        # The thread that started the coroutine is the one that ran the quick job:
        # nothing was retired, no thread started in its place.
        assert quick_threads == ["jobs-worker-0"]
        assert [t.name for t in worker.slots.threads] == ["jobs-worker-0"]
        release.set()
        wait_until(lambda: late, 30, "the stubborn coroutine to return")
    finally:
        release.set()
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert late == [False]
    after = JobScope(SCOPE).get("stubborn")
    assert (after.status, after.result_ref, after.progress) == (JobStatus.FAILED, None, None)
    assert (worker.stats.failed, worker.stats.succeeded) == (1, 1)


def test_an_async_handler_that_returns_because_of_shutdown_is_released(handler):
    started = threading.Event()

    @handler("a.polite")
    async def polite(ctx):
        started.set()
        await ctx.await_for_cancel(30)
        assert ctx.shutdown_requested
        return "stopped early"

    submit_job(SCOPE, "polite", JobSubmission.create("a.polite"))
    worker = Worker(listen=False, shutdown_timeout=0, cancel_grace=10)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(30)
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()
    snap = JobScope(SCOPE).get("polite")
    assert snap.status == JobStatus.QUEUED
    assert snap.attempt_count == 0
    assert [a.status for a in snap.attempts] == [AttemptStatus.RELEASED]
    assert worker.stats.released == 1


def test_an_async_handlers_failure_is_retried_by_its_policy(handler):
    runs: list[int] = []

    @handler("a.flaky", retry=RetryPolicy(base_delay=0, jitter=0))
    async def flaky(ctx):
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ValueError("first time")
        return "second time"

    submit_job(SCOPE, "flaky", JobSubmission.create("a.flaky", max_attempts=2))
    stats = Worker(burst=True, listen=False, concurrency=2).run()
    snap = JobScope(SCOPE).get("flaky")
    assert (snap.status, snap.result_ref) == (JobStatus.SUCCEEDED, "second time")
    assert runs == [1, 2]
    assert "ValueError: first time" in snap.attempts[0].error
    assert (stats.retried, stats.succeeded) == (1, 1)
