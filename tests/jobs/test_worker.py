"""In process: the Worker engine, handler registry, JobContext and retry policy."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime

import pytest

from jobs import JobContext, JobScope, JobStatus, JobSubmission, job_handler, submit_job
from jobs.exceptions import JobCancelled, JobsConfigurationError, UnknownHandler
from jobs.handlers import PermanentFailure, RetryPolicy, get_handler
from jobs.models import Job
from jobs.types import AttemptStatus, FinishOutcome
from jobs.worker import Worker

SCOPE = "worker-tests"


def run_burst(**kwargs) -> Worker:
    worker = Worker(burst=True, listen=False, **kwargs)
    worker.run()
    return worker


class TestRetryPolicy:
    def test_delay_grows_exponentially_and_is_capped(self):
        policy = RetryPolicy(base_delay=2, factor=2, max_delay=10, jitter=0)
        assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [2, 4, 8, 10, 10]

    def test_jitter_stays_within_its_ratio(self):
        policy = RetryPolicy(base_delay=4, factor=2, jitter=0.25)
        rng = random.Random(7)
        delays = [policy.delay(1, rng) for _ in range(200)]
        assert min(delays) >= 3.0
        assert max(delays) <= 5.0
        assert len(set(delays)) > 100  # spread, not one fixed value

    def test_default_first_delay_is_at_most_ten_seconds(self, settings):
        settings.JOBS = {}
        policy = RetryPolicy.from_settings()
        assert max(policy.delay(1, random.Random(s)) for s in range(50)) <= 10

    def test_permanent_failure_and_unlisted_exceptions_are_not_retried(self):
        policy = RetryPolicy(retry_on=(ConnectionError,))
        now = datetime(2026, 1, 1, tzinfo=UTC)
        assert policy.retry_at(1, now, ConnectionError()) is not None
        assert policy.retry_at(1, now, ValueError()) is None
        assert RetryPolicy().retry_at(1, now, PermanentFailure()) is None
        assert RetryPolicy().retry_at(1, now, JobCancelled()) is None

    @pytest.mark.parametrize(
        "kwargs", [{"base_delay": -1}, {"factor": 0.5}, {"jitter": 1.0}, {"max_delay": -2}]
    )
    def test_bad_policy_is_a_configuration_error(self, kwargs):
        with pytest.raises(JobsConfigurationError):
            RetryPolicy(**kwargs)


class TestRegistry:
    def test_unknown_handler_names_name_and_version(self, handler):
        handler("reg.known", version=1)(lambda ctx: None)
        with pytest.raises(UnknownHandler, match=r"'reg.known' version 2 .*\[1\]"):
            get_handler("reg.known", 2)

    def test_a_different_function_cannot_take_a_registered_name(self, handler):
        def first(ctx):
            return None

        def second(ctx):
            return None

        handler("reg.taken")(first)
        with pytest.raises(JobsConfigurationError, match="already registered"):
            job_handler("reg.taken")(second)
        assert get_handler("reg.taken", 1).func is first

    def test_async_handlers_are_recognised(self, handler):
        async def coro(ctx):
            return None

        handler("reg.async")(coro)
        assert get_handler("reg.async", 1).is_async


@pytest.mark.django_db(transaction=True)
class TestWorkerInProcess:
    def test_async_handler_runs_with_progress(self, handler):
        @handler("w.async")
        async def run(ctx: JobContext) -> str:
            await ctx.areport_progress(60, "most")
            return f"done {ctx.payload['n']}"

        submit_job(SCOPE, "a", JobSubmission.create("w.async", {"n": 3}))
        worker = run_burst()
        snap = JobScope(SCOPE).get("a")
        assert snap.status == JobStatus.SUCCEEDED
        assert snap.result_ref == "done 3"
        assert snap.progress == 60
        assert worker.stats.succeeded == 1

    def test_context_carries_identity(self, handler):
        seen = {}

        @handler("w.identity")
        def run(ctx: JobContext) -> None:
            seen.update(
                job_id=ctx.job_id,
                attempt=ctx.attempt,
                token=ctx.token,
                scope_hash=ctx.scope_hash,
                payload=ctx.payload,
            )

        snap = submit_job(SCOPE, "ident", JobSubmission.create("w.identity", [1, "x"]))
        run_burst(worker_id="ident-worker")
        done = JobScope(SCOPE).get("ident")
        assert seen["job_id"] == "ident"
        assert seen["attempt"] == 1
        assert seen["scope_hash"] == snap.scope_hash
        assert seen["payload"] == [1, "x"]
        assert len(seen["token"]) == 32
        assert done.result_ref is None
        assert done.attempts[0].worker_id == "ident-worker"

    def test_non_string_result_fails_the_job(self, handler):
        handler("w.badresult")(lambda ctx: 42)
        submit_job(SCOPE, "bad", JobSubmission.create("w.badresult"))
        run_burst()
        snap = JobScope(SCOPE).get("bad")
        assert snap.status == JobStatus.FAILED
        assert "TypeError" in snap.error
        assert "must be a str or None" in snap.error

    def test_error_text_with_lone_surrogate_and_nul_is_stored_escaped(self, handler):
        @handler("w.badtext")
        def run(ctx):
            raise RuntimeError("bad \ud800 and \x00 inside")

        submit_job(SCOPE, "badtext", JobSubmission.create("w.badtext"))
        run_burst()
        snap = JobScope(SCOPE).get("badtext")
        assert snap.status == JobStatus.FAILED
        assert "RuntimeError: bad \\ud800 and \\x00 inside" in snap.error

    def test_permanent_failure_is_not_retried(self, handler):
        @handler("w.permanent", retry=RetryPolicy(base_delay=0, jitter=0))
        def run(ctx):
            raise PermanentFailure("card declined")

        submit_job(SCOPE, "p", JobSubmission.create("w.permanent", max_attempts=5))
        run_burst()
        snap = JobScope(SCOPE).get("p")
        assert snap.status == JobStatus.FAILED
        assert snap.attempt_count == 1
        assert "card declined" in snap.error

    def test_retries_never_exceed_max_attempts(self, handler):
        @handler("w.always", retry=RetryPolicy(base_delay=0, jitter=0))
        def run(ctx):
            raise RuntimeError(f"attempt {ctx.attempt}")

        submit_job(SCOPE, "r", JobSubmission.create("w.always", max_attempts=3))
        worker = run_burst()
        snap = JobScope(SCOPE).get("r")
        assert snap.status == JobStatus.FAILED
        assert snap.attempt_count == 3
        assert [a.status for a in snap.attempts] == [AttemptStatus.FAILED] * 3
        assert worker.stats.retried == 2
        assert worker.stats.failed == 1

    def test_claims_never_exceed_free_capacity(self, handler):
        """However its settles interleave (main loop and handler threads), the
        jobs a worker holds Running never outnumber its concurrency."""
        concurrency = 3
        together = threading.Barrier(concurrency, timeout=10)
        seen: list[int] = []

        @handler("w.count")
        def run(ctx):
            if ctx.payload["n"] < concurrency:
                together.wait()  # the first batch runs at the same time: the limit is reached
            seen.append(Job.objects.filter(status=JobStatus.RUNNING).count())

        for n in range(60):
            submit_job(SCOPE, f"c{n}", JobSubmission.create("w.count", {"n": n}))
        worker = run_burst(concurrency=concurrency)
        assert worker.stats.succeeded == 60
        assert len(seen) == 60
        assert max(seen) == concurrency

    def test_queue_selection(self, handler):
        handler("w.q")(lambda ctx: ctx.queue)
        submit_job(SCOPE, "in-a", JobSubmission.create("w.q", queue="a"))
        submit_job(SCOPE, "in-b", JobSubmission.create("w.q", queue="b"))
        run_burst(queues=["a"])
        assert JobScope(SCOPE).get("in-a").status == JobStatus.SUCCEEDED
        assert JobScope(SCOPE).get("in-b").status == JobStatus.QUEUED

    def test_shutdown_requeues_a_handler_that_ignores_it_and_fences_its_late_result(self, handler):
        started, release = threading.Event(), threading.Event()
        finished: list[FinishOutcome] = []

        @handler("w.stubborn")
        def run(ctx):
            started.set()
            release.wait(30)  # ignores ctx's cancellation signal on purpose
            return "late result"

        submit_job(SCOPE, "s", JobSubmission.create("w.stubborn", max_attempts=2))
        worker = Worker(listen=False, shutdown_timeout=0, cancel_grace=0.05)
        original_finish = worker.finisher.finish

        def recording_finish(claim, event, call, detail=""):
            return original_finish(
                claim, event, lambda: finished.append(call()) or finished[-1], detail
            )

        worker.finisher.finish = recording_finish
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert started.wait(30)
        worker.stop()
        thread.join(30)
        assert not thread.is_alive()
        snap = JobScope(SCOPE).get("s")
        assert snap.status == JobStatus.QUEUED  # re-queued for the next worker
        assert snap.attempts[0].status == AttemptStatus.INTERRUPTED
        # The handler now returns; its token has ended, so its result changes nothing.
        release.set()
        worker.slots.threads[0].join(30)
        assert finished == [FinishOutcome.STALE]
        assert JobScope(SCOPE).get("s").status == JobStatus.QUEUED

    def test_handler_that_returns_because_of_shutdown_is_released_not_completed(self, handler):
        """With the default single attempt: the shutdown gives the claim back, so the
        job is Queued again with its attempt unused, never final with its work undone."""
        started = threading.Event()
        ran: list[int] = []

        @handler("w.polite")
        def run(ctx):
            ran.append(ctx.attempt)
            if len(ran) > 1:
                return "done"
            started.set()
            ctx.wait_for_cancel(30)
            assert ctx.shutdown_requested
            return "stopped early"

        submit_job(SCOPE, "polite", JobSubmission.create("w.polite"))
        worker = Worker(listen=False, shutdown_timeout=0, cancel_grace=10)
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert started.wait(30)
        worker.stop()
        thread.join(30)
        snap = JobScope(SCOPE).get("polite")
        assert snap.status == JobStatus.QUEUED
        assert snap.result_ref is None
        assert snap.attempt_count == 0
        assert [a.status for a in snap.attempts] == [AttemptStatus.RELEASED]
        assert (worker.stats.released, worker.stats.requeued, worker.stats.interrupted) == (1, 0, 0)
        # The next worker runs it as the job's first attempt again.
        run_burst()
        snap = JobScope(SCOPE).get("polite")
        assert snap.status == JobStatus.SUCCEEDED
        assert ran == [1, 1]
        assert [a.number for a in snap.attempts] == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_postgres_notify_wakes_an_idle_worker(handler, settings):
    """With polling effectively off (60 s), only the NOTIFY sent by the submitting
    transaction can make the idle worker pick the job up within the bound."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")
    settings.JOBS = {
        "POLL_INTERVAL": 60,
        "RECOVERY_INTERVAL": 60,
        "HEARTBEAT_SECONDS": 10,
        "LEASE_SECONDS": 30,
    }
    ran = threading.Event()

    @handler("w.notify")
    def run(ctx):
        ran.set()

    worker = Worker()
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert worker.started.wait(30)
        assert worker.slots.listener is not None
        assert worker.slots.listener.ready.wait(30)
        submit_job(SCOPE, "wake", JobSubmission.create("w.notify"))
        assert ran.wait(10), "the worker was not woken by NOTIFY"
    finally:
        worker.stop()
        thread.join(30)
    assert JobScope(SCOPE).get("wake").status == JobStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_waits_between_claims_instead_of_spinning(settings, monkeypatch):
    """Nothing is due: every pass of the main loop claims once and then waits for its
    poll interval. A settle that claimed fewer jobs than it asked for must not wake
    the loop (it used to, so an idle worker ran claim statements back to back)."""
    settings.JOBS = {"POLL_INTERVAL": 0.05, "RECOVERY_INTERVAL": 60, "CANCEL_POLL_INTERVAL": 60}
    woken_at_pause: list[bool] = []
    enough = threading.Event()
    worker = Worker(concurrency=2, listen=False)
    original = worker.pause

    def pause(timeout, **kwargs):
        woken_at_pause.append(worker._wake.is_set())
        if len(woken_at_pause) >= 5:
            enough.set()
        return original(timeout, **kwargs)

    monkeypatch.setattr(worker, "pause", pause)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert enough.wait(30)
    finally:
        worker.stop()
        thread.join(30)
    assert not any(woken_at_pause[:5]), woken_at_pause[:5]
