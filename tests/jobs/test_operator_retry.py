"""An operator re-runs a finished job that used all its attempts by granting more:
``JobScope.retry(job_id, extra_attempts=N)`` raises ``max_attempts`` in the same
guarded statement that re-queues the job; bad grants are typed errors that change
nothing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from jobs import JobSubmission, execution
from jobs.exceptions import InvalidSubmission, InvalidTransition, JobIdentityConflict
from jobs.types import JobStatus

RETRYABLE = [JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED]

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("status", RETRYABLE)
def test_extra_attempts_requeue_a_job_with_none_left(make_job, scope, status) -> None:
    make_job.finished(status, "job-1", max_attempts=1)

    snap = scope.retry("job-1", extra_attempts=2)

    assert snap.status == JobStatus.QUEUED
    row = make_job.row("job-1")
    assert (row.status, row.max_attempts, row.attempt_count) == (JobStatus.QUEUED, 3, 1)
    claim = execution.try_start(make_job.scope_hash, "job-1")
    assert claim is not None
    assert claim.attempt == 2


def test_without_a_grant_a_job_with_no_attempts_left_is_refused(make_job, scope, unchanged):
    make_job.finished(JobStatus.FAILED, "job-1", max_attempts=1)
    with unchanged(), pytest.raises(InvalidTransition, match=r"1 of 1 used.*extra_attempts"):
        scope.retry("job-1")


def test_a_grant_raises_max_attempts_even_with_attempts_left(make_job, scope) -> None:
    make_job.finished(JobStatus.FAILED, "job-1", max_attempts=3)
    scope.retry("job-1", extra_attempts=1)
    assert make_job.row("job-1").max_attempts == 4


def test_after_a_grant_the_original_request_is_still_the_same_job(scope) -> None:
    """A grant raises ``max_attempts`` but not the request's identity: the caller's
    repeat of its submission returns the job, in one call and in a batch; a request
    for the raised count is a different one."""
    submission = JobSubmission.create("test.record", {"n": 1}, max_attempts=1)
    scope.submit("job-1", submission)
    claim = execution.try_start(scope.scope_hash, "job-1")
    assert claim is not None
    execution.fail(claim.token, "boom")
    scope.retry("job-1", extra_attempts=2)

    again = scope.submit("job-1", submission)
    assert (again.created, again.max_attempts, again.granted_attempts) == (False, 3, 2)
    assert again.status == JobStatus.QUEUED
    [result] = scope.submit_many([("job-1", submission)])
    assert result.job().created is False
    with pytest.raises(JobIdentityConflict) as conflict:
        scope.submit("job-1", JobSubmission.create("test.record", {"n": 1}, max_attempts=3))
    assert conflict.value.fields == ("max_attempts",)


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.RUNNING, JobStatus.QUEUED])
def test_a_grant_does_not_requeue_other_states(make_job, scope, unchanged, status) -> None:
    if status is JobStatus.QUEUED:
        make_job.queued("job-1", max_attempts=1)
    elif status is JobStatus.RUNNING:
        make_job.running("job-1", max_attempts=1)
    else:
        make_job.finished(status, "job-1", max_attempts=1)
    with unchanged(), pytest.raises(InvalidTransition, match=status.value):
        scope.retry("job-1", extra_attempts=5)


@pytest.mark.parametrize(
    "extra",
    [-1, True, False, 1.0, "1", None, 10**5000, 1001],
    ids=["negative", "true", "false", "float", "str", "none", "huge", "over-limit"],
)
def test_bad_grants_are_typed_and_change_nothing(make_job, scope, unchanged, extra) -> None:
    make_job.finished(JobStatus.FAILED, "job-1", max_attempts=1)
    with unchanged(), pytest.raises(InvalidSubmission, match="extra_attempts"):
        scope.retry("job-1", extra_attempts=extra)


def test_a_grant_past_the_max_attempts_limit_is_refused(make_job, scope, unchanged) -> None:
    make_job.finished(JobStatus.FAILED, "job-1", max_attempts=999)
    with unchanged(), pytest.raises(InvalidSubmission, match="above 1000"):
        scope.retry("job-1", extra_attempts=2)
    assert scope.retry("job-1", extra_attempts=1).status == JobStatus.QUEUED
    assert make_job.row("job-1").max_attempts == 1000


def test_not_before_out_of_range_in_utc_is_typed(make_job, scope, unchanged) -> None:
    make_job.finished(JobStatus.FAILED, "job-1", max_attempts=1)
    far = datetime.max.replace(tzinfo=timezone(timedelta(hours=-5)))
    with unchanged(), pytest.raises(InvalidSubmission, match="out of range"):
        scope.retry("job-1", not_before=far, extra_attempts=1)
