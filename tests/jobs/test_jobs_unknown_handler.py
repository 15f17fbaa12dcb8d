"""A job whose handler or version this worker does not know (a rolling deploy)
goes back to Queued, later, without consuming an attempt, until
``JOBS["UNKNOWN_HANDLER_RETRY_SECONDS"]`` have passed since its first such claim;
then it fails naming the handler and version — still without consuming an attempt, so
that it can be retried once a worker knows the handler.

Time is injected (``now=``, the worker's ``clock``), never waited for."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import JobScope, JobStatus, JobSubmission, execution, job_handler, submit_job
from jobs.exceptions import AttemptRowMissing
from jobs.handlers import unregister
from jobs.models import JobAttempt
from jobs.testing import run_jobs_inline
from jobs.types import FinishOutcome
from jobs.worker import Worker

SCOPE = "rolling-deploy"
WINDOW = 600.0  # UNKNOWN_HANDLER_RETRY_SECONDS
DELAY = 10.0  # UNKNOWN_HANDLER_RETRY_DELAY
REASON = "no handler registered for 'deploy.next' version 2; is its app's tasks module imported?"


@pytest.fixture(autouse=True)
def window(settings):
    settings.JOBS = {
        **settings.JOBS,
        "UNKNOWN_HANDLER_RETRY_SECONDS": WINDOW,
        "UNKNOWN_HANDLER_RETRY_DELAY": DELAY,
    }


@pytest.fixture
def known_v1():
    @job_handler("deploy.next", version=1)
    def v1(ctx) -> str:
        return "v1"

    yield
    unregister("deploy.next", 1)


def submit(job_id: str = "j", *, version: int = 2, max_attempts: int = 1):
    return submit_job(
        SCOPE,
        job_id,
        JobSubmission.create("deploy.next", {}, version=version, max_attempts=max_attempts),
    )


def claim_at(now, job_id: str = "j"):
    snap = JobScope(SCOPE).get(job_id)
    claim = execution.try_start(snap.scope_hash, job_id, "old-worker", now=now)
    assert claim is not None
    return claim


@pytest.mark.django_db
class TestStore:
    def test_put_back_without_consuming_an_attempt_then_failed_after_the_window(self) -> None:
        submit()
        t0 = timezone.now()
        claim = claim_at(t0)
        assert execution.put_back_unknown_handler(claim.token, REASON, now=t0) is (
            FinishOutcome.PUT_BACK
        )
        snap = JobScope(SCOPE).get("j")
        assert snap.status == JobStatus.QUEUED
        assert snap.attempt_count == 0
        assert snap.attempts == ()
        assert snap.next_run_at == t0 + timedelta(seconds=DELAY)
        assert "'deploy.next' version 2" in snap.error
        assert "UNKNOWN_HANDLER_RETRY_SECONDS" in snap.error
        assert execution.get_due(now=t0) == []  # later, not at once
        assert [d.job_id for d in execution.get_due(now=t0 + timedelta(seconds=DELAY))] == ["j"]

        # Still inside the window, measured from the FIRST such claim.
        almost = t0 + timedelta(seconds=WINDOW - 1)
        again = claim_at(almost)
        assert again.attempt == 1  # the same attempt number: none was consumed
        assert execution.put_back_unknown_handler(again.token, REASON, now=almost) is (
            FinishOutcome.PUT_BACK
        )
        assert JobScope(SCOPE).get("j").next_run_at == almost + timedelta(seconds=DELAY)

        late = almost + timedelta(seconds=DELAY)  # the next claim, past the window
        last = claim_at(late)
        assert execution.put_back_unknown_handler(last.token, REASON, now=late) is (
            FinishOutcome.FAILED
        )
        snap = JobScope(SCOPE).get("j")
        assert snap.status == JobStatus.FAILED
        assert snap.finished_at == late
        assert snap.error.startswith(REASON)
        assert f"within {WINDOW:g} s" in snap.error
        assert (snap.attempt_count, snap.attempts) == (0, ())

        # Nothing was consumed: once a worker knows the handler, it can be retried.
        retried = JobScope(SCOPE).retry("j")
        assert retried.status == JobStatus.QUEUED
        later = late + timedelta(seconds=1)
        again = claim_at(later)
        # A retry starts a new window.
        assert execution.put_back_unknown_handler(again.token, REASON, now=later) is (
            FinishOutcome.PUT_BACK
        )

    def test_a_zero_window_fails_at_the_first_claim(self, settings) -> None:
        settings.JOBS = {**settings.JOBS, "UNKNOWN_HANDLER_RETRY_SECONDS": 0}
        submit()
        now = timezone.now()
        claim = claim_at(now)
        assert execution.put_back_unknown_handler(claim.token, REASON, now=now) is (
            FinishOutcome.FAILED
        )
        assert JobScope(SCOPE).get("j").status == JobStatus.FAILED

    def test_a_cancel_requested_meanwhile_ends_cancelled(self) -> None:
        submit()
        now = timezone.now()
        claim = claim_at(now)
        JobScope(SCOPE).cancel("j")
        assert execution.put_back_unknown_handler(claim.token, REASON, now=now) is (
            FinishOutcome.CANCELLED
        )
        snap = JobScope(SCOPE).get("j")
        assert (snap.status, snap.attempt_count, snap.error) == (JobStatus.CANCELLED, 0, "")

    def test_a_stale_token_changes_nothing(self, unchanged) -> None:
        submit()
        now = timezone.now()
        claim = claim_at(now)
        assert execution.put_back_unknown_handler(claim.token, REASON, now=now)
        with unchanged():
            assert execution.put_back_unknown_handler(claim.token, REASON, now=now) is (
                FinishOutcome.STALE
            )
            assert not execution.put_back_unknown_handler("nope", REASON, now=now)

    def test_a_missing_attempt_row_changes_nothing(self, unchanged) -> None:
        submit()
        now = timezone.now()
        claim = claim_at(now)
        JobAttempt.objects.filter(token=claim.token).delete()
        with unchanged(), pytest.raises(AttemptRowMissing):
            execution.put_back_unknown_handler(claim.token, REASON, now=now)


@pytest.mark.django_db(transaction=True)
def test_the_worker_puts_back_what_it_does_not_know_and_runs_the_rest(known_v1) -> None:
    submit("v2")  # a newer version than this worker knows
    submit("v1", version=1)
    t0 = timezone.now()
    clock = {"now": t0}
    worker = Worker(burst=True, listen=False, clock=lambda: clock["now"])
    worker.run()
    v2, v1 = JobScope(SCOPE).get("v2"), JobScope(SCOPE).get("v1")
    assert (v1.status, v1.result_ref) == (JobStatus.SUCCEEDED, "v1")
    assert (v2.status, v2.attempt_count, v2.attempts) == (JobStatus.QUEUED, 0, ())
    assert "'deploy.next' version 2 (registered versions: [1])" in v2.error
    assert worker.stats.put_back == 1
    assert worker.stats.failed == 0

    clock["now"] = t0 + timedelta(seconds=WINDOW)
    later = Worker(burst=True, listen=False, clock=lambda: clock["now"])
    later.run()
    v2 = JobScope(SCOPE).get("v2")
    assert (v2.status, v2.attempt_count) == (JobStatus.FAILED, 0)
    assert "'deploy.next' version 2" in v2.error
    assert later.stats.failed == 1


@pytest.mark.django_db
def test_run_jobs_inline_follows_the_same_rule() -> None:
    submit()
    t0 = timezone.now()
    (first,) = run_jobs_inline(now=t0)
    assert first.outcome is FinishOutcome.PUT_BACK
    assert "'deploy.next' version 2" in first.error
    assert run_jobs_inline(now=t0) == []  # put back for later
    (last,) = run_jobs_inline(now=t0 + timedelta(seconds=WINDOW))
    assert last.outcome is FinishOutcome.FAILED
    assert JobScope(SCOPE).get("j").status == JobStatus.FAILED


@pytest.mark.django_db(transaction=True)
def test_a_misspelt_handler_name_gets_a_suggestion_in_the_jobs_error(known_v1) -> None:
    """The put-back reason a person reads in the admin names the handler meant."""
    submit_job(SCOPE, "typo", JobSubmission.create("deploy.nxet", {}))
    submit_job(SCOPE, "other", JobSubmission.create("nothing.like.it", {}))
    Worker(burst=True, listen=False).run()
    typo, other = JobScope(SCOPE).get("typo"), JobScope(SCOPE).get("other")
    assert typo.status == other.status == JobStatus.QUEUED
    assert "no handler registered for 'deploy.nxet' version 1 (did you mean 'deploy.next'?)" in (
        typo.error
    )
    assert "did you mean" not in other.error
