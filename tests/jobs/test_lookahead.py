"""Look-ahead claims (``JOBS["PREFETCH"]``): a worker claims ahead of the slots that
will free soon. Look-ahead jobs are Running under the worker's lease with their own
tokens, count for every flow limit, are given back at a graceful shutdown without
using an attempt, and are never taken (nor kept) behind long handlers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from jobs import JobScope, JobStatus, JobSubmission, submit_job
from jobs.conf import jobs_settings
from jobs.exceptions import JobsConfigurationError
from jobs.models import Job, JobAttempt
from jobs.types import AttemptStatus
from jobs.worker import Worker
from jobs.worker.slots import AUTO_PREFETCH, AUTO_PREFETCH_SMALL
from tests.support.procs import wait_until

SCOPE = "lookahead"

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = {
    "POLL_INTERVAL": 0.02,
    "RECOVERY_INTERVAL": 60,
    "CANCEL_POLL_INTERVAL": 60,
}


def submit(n: int, handler: str = "ahead.hold", **kwargs) -> None:
    for i in range(n):
        submit_job(SCOPE, f"j{i}", JobSubmission.create(handler, {"n": i}, **kwargs))


def running() -> list[Job]:
    return list(Job.objects.filter(status=JobStatus.RUNNING))


def counted_passes(worker: Worker) -> threading.Semaphore:
    """A semaphore released at every pass of ``worker``'s main loop (each pass
    settles and claims), for a test to wait for a number of passes."""
    passes = threading.Semaphore(0)
    original = worker.pause

    def pause(timeout, **kwargs):
        passes.release()
        return original(timeout, **kwargs)

    worker.pause = pause  # type: ignore[method-assign]
    return passes


@contextmanager
def worker_running(worker: Worker) -> Iterator[threading.Thread]:
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(30)


def held_once_claimed(worker: Worker, started: list[str]) -> tuple[int, int, int]:
    """Run ``worker`` until each of its slots started a held handler and its main loop
    passed ten more times, each pass claiming; then the attempts it holds and the jobs
    Running and Queued, read while it runs."""
    passes = counted_passes(worker)
    with worker_running(worker):
        wait_until(lambda: len(started) == worker.concurrency, 30, "every slot's handler")
        for _ in range(10):
            assert passes.acquire(timeout=30)
        queued = Job.objects.filter(status=JobStatus.QUEUED).count()
        return worker.running_count(), len(running()), queued


@pytest.fixture
def holding(handler):
    """A handler that runs until released (or its cancellation is signalled)."""
    release = threading.Event()
    started: list[str] = []

    @handler("ahead.hold")
    def run(ctx):
        started.append(ctx.job_id)
        while not release.is_set():
            if ctx.wait_for_cancel(0.01):
                return "stopped"
        return "done"

    yield release, started
    release.set()


def test_lookahead_jobs_are_running_under_the_lease_and_given_back_at_shutdown(settings, holding):
    _release, started = holding
    # Two slots, one look-ahead job at most (PREFETCH), the next slot's to be.
    settings.JOBS = {**QUICK, "PREFETCH": 1, "PREFETCH_MAX_WAIT": 60}
    submit(5)
    worker = Worker(concurrency=2, listen=False, worker_id="ahead-1", shutdown_timeout=0)
    with worker_running(worker):
        wait_until(lambda: len(running()) == 3, 30, "two jobs running and one looked ahead")
        wait_until(lambda: len(started) == 2, 30, "both handlers to start")
        jobs = running()
        # Every look-ahead job is a claim like any other: Running, its own token,
        # leased by this worker, its attempt counted until it is given back.
        assert {j.leased_by for j in jobs} == {"ahead-1"}
        assert len({j.current_token for j in jobs}) == 3
        assert all(j.lease_expires_at is not None and j.attempt_count == 1 for j in jobs)
        assert set(worker.running_tokens) == {j.current_token for j in jobs}
    # The shutdown gave all three back: the handlers stopped on their signal, the
    # look-ahead job never started. No attempt was used.
    assert worker.stats.released == 3, worker.stats
    assert not running()
    for job in Job.objects.all():
        assert job.status == JobStatus.QUEUED
        assert job.attempt_count == 0
        assert list(job.attempts.values_list("status", flat=True)) in (
            [],
            [AttemptStatus.RELEASED],
        )
    assert Job.objects.filter(attempts__status=AttemptStatus.RELEASED).count() == 3


def test_lookahead_counts_for_flow_limits(settings, holding):
    _release, started = holding
    settings.JOBS = {
        **QUICK,
        "PREFETCH": 4,
        "PREFETCH_MAX_WAIT": 60,
        "QUEUES": {"limited": {"max_running": 1}},
    }
    submit(6, queue="limited")
    # Without the limit this worker would hold two: one running, one looked ahead.
    worker = Worker(concurrency=1, listen=False, shutdown_timeout=0)
    assert held_once_claimed(worker, started) == (1, 1, 5)


def test_lookahead_is_shared_by_the_slots_and_bounded_by_prefetch(settings, holding):
    """Free and young slots share the look-ahead (each ``PREFETCH / concurrency``,
    rounded up), so that a worker with few slots claims as many jobs a statement as
    its look-ahead allows — never more than ``PREFETCH`` waiting in all."""
    _release, started = holding
    settings.JOBS = {**QUICK, "PREFETCH": 3, "PREFETCH_MAX_WAIT": 60}
    submit(8)
    worker = Worker(concurrency=2, listen=False, shutdown_timeout=0)
    # Two handlers running, three jobs waiting for them: PREFETCH, not one per slot.
    assert held_once_claimed(worker, started) == (5, 5, 3)


@pytest.mark.parametrize(
    ("queues", "looked_ahead"),
    [({}, AUTO_PREFETCH), ({"default": {"max_running": 1000}}, AUTO_PREFETCH_SMALL)],
    ids=["no-limit", "a-limit"],
)
def test_an_unset_prefetch_looks_ahead_less_where_a_flow_limit_applies(
    settings, holding, queues, looked_ahead
):
    """``PREFETCH`` None: the worker chooses its look-ahead — the larger one where no
    flow limit applies to its queues, the smaller where one does (the jobs claimed
    ahead hold the limit's places), however far the limit is from binding."""
    _release, started = holding
    settings.JOBS = {**QUICK, "PREFETCH": None, "PREFETCH_MAX_WAIT": 60, "QUEUES": queues}
    submit(AUTO_PREFETCH + 8)
    worker = Worker(concurrency=2, listen=False, shutdown_timeout=0)
    held = 2 + looked_ahead
    assert held_once_claimed(worker, started) == (held, held, AUTO_PREFETCH + 8 - held)


def test_handlers_typically_longer_than_the_wait_get_no_lookahead(settings, handler):
    """Once handlers are known to run longer than ``PREFETCH_MAX_WAIT``, a free slot
    gets no look-ahead either: jobs are not claimed only to be given back. Only
    claims made before the first handler returned (the run time still unknown) are
    released."""
    settings.JOBS = {**QUICK, "PREFETCH": 3, "PREFETCH_MAX_WAIT": 0.05}

    @handler("ahead.slow")
    def run(ctx):
        ctx.wait_for_cancel(0.1)  # its work: a tenth of a second, twice the wait

    submit(8, "ahead.slow")
    worker = Worker(concurrency=1, burst=True, listen=False)
    worker.run()
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 8
    first_end = JobAttempt.objects.filter(status=AttemptStatus.SUCCEEDED).earliest("finished_at")
    released = JobAttempt.objects.filter(status=AttemptStatus.RELEASED)
    # Those claimed ahead before any handler returned may be given back; none after.
    assert worker.stats.released == released.count()
    assert not released.filter(started_at__gt=first_end.finished_at).exists()


def test_no_lookahead_behind_a_long_handler(settings, holding):
    """A handler that has run longer than PREFETCH_MAX_WAIT gets no look-ahead: the
    other jobs stay Queued for other workers (any taken while it was young are given
    back once they waited that long)."""
    _release, started = holding
    settings.JOBS = {**QUICK, "PREFETCH": 3, "PREFETCH_MAX_WAIT": 0.05}
    submit(4)
    worker = Worker(concurrency=1, listen=False, shutdown_timeout=0)
    passes = counted_passes(worker)
    with worker_running(worker):
        wait_until(lambda: len(running()) == 1, 30, "only the long handler's job Running")
        for _ in range(20):
            assert passes.acquire(timeout=30)
        assert len(running()) == 1
        assert worker.running_count() == 1
        assert len(started) == 1
        queued = Job.objects.filter(status=JobStatus.QUEUED)
        assert queued.count() == 3
        assert all(job.attempt_count == 0 for job in queued)


def test_lookahead_runs_every_job_once(settings, handler):
    settings.JOBS = {**QUICK, "PREFETCH": 4}
    ran: list[str] = []
    handler("ahead.quick")(lambda ctx: ran.append(ctx.job_id) or "ok")
    submit(40, "ahead.quick")
    worker = Worker(concurrency=2, burst=True, listen=False)
    worker.run()
    assert sorted(ran) == sorted(f"j{i}" for i in range(40))
    assert JobScope(SCOPE).get("j0").status == JobStatus.SUCCEEDED
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 40
    assert worker.stats.succeeded == 40


def test_prefetch_is_unset_by_default(settings):
    settings.JOBS = {}
    assert jobs_settings().PREFETCH is None


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", 1001])
def test_prefetch_must_be_a_small_int(settings, bad):
    settings.JOBS = {"PREFETCH": bad}
    with pytest.raises(JobsConfigurationError, match="PREFETCH"):
        jobs_settings()


@pytest.mark.parametrize("bad", [0, -1, "1"])
def test_prefetch_max_wait_must_be_positive(settings, bad):
    settings.JOBS = {"PREFETCH_MAX_WAIT": bad}
    with pytest.raises(JobsConfigurationError, match="PREFETCH_MAX_WAIT"):
        jobs_settings()
