"""The release transition: a worker gives a claim back unused at its graceful
shutdown — the job Queued again, its attempt count restored, the attempt row
Released — fenced by the attempt's token."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import JobScope, JobStatus, JobSubmission, execution, submit_job
from jobs.exceptions import InvalidInput
from jobs.models import Job
from jobs.testing import run_jobs_inline
from jobs.types import AttemptStatus, FinishOutcome

SCOPE = "release-tests"

pytestmark = pytest.mark.django_db(transaction=True)


def claim_one(job_id: str = "r", **kwargs):
    submit_job(SCOPE, job_id, JobSubmission.create("release.h", **kwargs))
    [claim] = execution.claim_due("w-1", limit=1)
    return claim


def test_release_queues_the_job_again_without_consuming_its_attempt():
    claim = claim_one()
    assert JobScope(SCOPE).get("r").attempt_count == 1
    assert execution.release(claim.token, "released: test") is FinishOutcome.RELEASED
    snap = JobScope(SCOPE).get("r")
    assert (snap.status, snap.attempt_count, snap.max_attempts) == (JobStatus.QUEUED, 0, 1)
    [attempt] = snap.attempts
    assert (attempt.number, attempt.status, attempt.error) == (
        1,
        AttemptStatus.RELEASED,
        "released: test",
    )
    # Claimed again: the first counted attempt, under a new token and attempt row.
    [again] = execution.claim_due("w-2", limit=1)
    assert again.attempt == 1
    assert again.token != claim.token
    assert execution.complete(again.token, "done") is FinishOutcome.SUCCEEDED
    snap = JobScope(SCOPE).get("r")
    assert (snap.status, snap.attempt_count) == (JobStatus.SUCCEEDED, 1)
    assert [(a.number, a.status) for a in snap.attempts] == [
        (1, AttemptStatus.RELEASED),
        (2, AttemptStatus.SUCCEEDED),
    ]


def test_a_stale_token_changes_nothing():
    claim = claim_one()
    assert execution.release(claim.token) is FinishOutcome.RELEASED
    # Released once: the token is no longer current.
    assert execution.release(claim.token) is FinishOutcome.STALE
    assert execution.claim_due("w-2", limit=1)
    # The old token cannot give back the new claim, nor finish it.
    assert execution.release(claim.token) is FinishOutcome.STALE
    assert execution.complete(claim.token, "late") is FinishOutcome.STALE
    snap = JobScope(SCOPE).get("r")
    assert (snap.status, snap.attempt_count) == (JobStatus.RUNNING, 1)
    assert execution.release("0" * 32) is FinishOutcome.STALE


def test_a_finished_attempt_cannot_be_released():
    claim = claim_one()
    assert execution.complete(claim.token, "done") is FinishOutcome.SUCCEEDED
    assert execution.release(claim.token) is FinishOutcome.STALE
    snap = JobScope(SCOPE).get("r")
    assert (snap.status, snap.attempt_count) == (JobStatus.SUCCEEDED, 1)
    assert [a.status for a in snap.attempts] == [AttemptStatus.SUCCEEDED]


def test_a_cancel_request_that_committed_first_ends_the_job_cancelled():
    claim = claim_one()
    JobScope(SCOPE).cancel("r")
    assert execution.release(claim.token) is FinishOutcome.CANCELLED
    snap = JobScope(SCOPE).get("r")
    assert snap.status == JobStatus.CANCELLED
    # The attempt row ends as a stopped attempt would; the job is what was asked.
    assert [a.status for a in snap.attempts] == [AttemptStatus.INTERRUPTED]


def test_bad_input_is_a_typed_error_and_changes_nothing():
    claim = claim_one()
    for bad in ("", 17, None):
        with pytest.raises(InvalidInput):
            execution.release(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        execution.release(claim.token, 42)  # type: ignore[arg-type]
    snap = JobScope(SCOPE).get("r")
    assert (snap.status, snap.attempt_count) == (JobStatus.RUNNING, 1)


def test_releases_never_use_up_attempts(handler):
    """Released again and again, a one-attempt job still runs once and succeeds."""
    handler("release.h")(lambda ctx: f"attempt {ctx.attempt}")
    submit_job(SCOPE, "many", JobSubmission.create("release.h"))
    for _ in range(3):
        [claim] = execution.claim_due("w-1", limit=1)
        assert execution.release(claim.token) is FinishOutcome.RELEASED
    [run] = run_jobs_inline()
    assert run.outcome is FinishOutcome.SUCCEEDED
    snap = JobScope(SCOPE).get("many")
    assert (snap.status, snap.attempt_count, snap.result_ref) == (
        JobStatus.SUCCEEDED,
        1,
        "attempt 1",
    )
    assert [a.status for a in snap.attempts] == [AttemptStatus.RELEASED] * 3 + [
        AttemptStatus.SUCCEEDED
    ]


def test_a_release_starts_a_new_unknown_handler_window():
    """Like any re-queue but a put-back, a release clears the unknown-handler window:
    a worker that knew the handler ran it, so a later unknown claim starts afresh."""
    claim = claim_one()
    t0 = timezone.now()
    assert execution.put_back_unknown_handler(claim.token, "unknown", now=t0) is (
        FinishOutcome.PUT_BACK
    )
    assert Job.objects.get(job_id="r").handler_unknown_since == t0
    [known] = execution.claim_due("w-2", limit=1, now=t0 + timedelta(seconds=11))
    assert execution.release(known.token, now=t0 + timedelta(seconds=12)) is (
        FinishOutcome.RELEASED
    )
    assert Job.objects.get(job_id="r").handler_unknown_since is None
    # Long past the first window: an unknown claim is put back again, not failed.
    later = t0 + timedelta(hours=1)
    [again] = execution.claim_due("w-1", limit=1, now=later)
    assert execution.put_back_unknown_handler(again.token, "unknown", now=later) is (
        FinishOutcome.PUT_BACK
    )
    snap = JobScope(SCOPE).get("r")
    assert (snap.status, snap.attempt_count) == (JobStatus.QUEUED, 0)
    assert Job.objects.get(job_id="r").handler_unknown_since == later
