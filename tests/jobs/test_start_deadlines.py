"""Start deadlines: a job not started by ``start_by`` (or ``start_within`` seconds after
its submit) is never claimed, and the sweep ends it Expired — final, no attempt used."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from jobs import (
    JobScope,
    JobSnapshot,
    JobStatus,
    JobSubmission,
    execution,
    stage_job,
    store,
)
from jobs.api import submit_jobs
from jobs.exceptions import InvalidSubmission, InvalidTransition
from jobs.models import Job, JobAttempt
from jobs.signals import jobs_expired
from jobs.types import CancelOutcome

SCOPE = "tenant-deadlines"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def submit_at(job_id: str, submission: JobSubmission, *, now: datetime) -> JobSnapshot:
    """Submit as if at ``now`` (the store's clock)."""
    return store.submit(JobScope(SCOPE).scope_hash, job_id, submission, now=now)


def sub(**kwargs) -> JobSubmission:
    return JobSubmission.create("deadline.work", {"n": 1}, **kwargs)


@pytest.mark.django_db(transaction=True)
class TestDeadlines:
    def test_a_job_past_its_deadline_is_never_claimed_and_ends_expired(self) -> None:
        job = submit_at("late", sub(start_by=T0 + timedelta(seconds=10)), now=T0)
        assert job.start_by == T0 + timedelta(seconds=10)
        after = T0 + timedelta(seconds=10)
        assert execution.claim_due("w1", limit=5, now=after) == []
        assert execution.try_start(job.scope_hash, "late", now=after) is None
        assert execution.get_due(now=after) == []
        # Not yet swept, still Queued; the sweep ends it Expired, no attempt used.
        assert Job.objects.get().status == JobStatus.QUEUED
        assert execution.expire_jobs(now=after) == 1
        expired = JobScope(SCOPE).get("late")
        assert expired is not None
        assert expired.status == JobStatus.EXPIRED
        assert expired.status.is_finished
        assert (expired.attempt_count, expired.finished_at) == (0, after)
        assert "start deadline" in expired.error
        assert not JobAttempt.objects.exists()
        assert execution.expire_jobs(now=after) == 0

    def test_a_job_claimed_before_its_deadline_runs(self) -> None:
        submit_at("early", sub(start_within=30), now=T0)
        (claim,) = execution.claim_due("w1", now=T0 + timedelta(seconds=29))
        assert execution.expire_jobs(now=T0 + timedelta(hours=1)) == 0
        assert execution.complete(claim.token, now=T0 + timedelta(hours=1))
        assert Job.objects.get().status == JobStatus.SUCCEEDED

    def test_start_within_counts_from_the_submit(self) -> None:
        job = submit_at("rel", sub(start_within=2.5), now=T0)
        assert job.start_by == T0 + timedelta(seconds=2.5)
        assert Job.objects.get().start_by == T0 + timedelta(seconds=2.5)

    def test_the_deadline_holds_for_a_retry_too(self) -> None:
        submit_at("retried", sub(start_within=10, max_attempts=3), now=T0)
        (claim,) = execution.claim_due("w1", now=T0)
        execution.fail(claim.token, "boom", retry_at=T0 + timedelta(seconds=20), now=T0)
        assert execution.claim_due("w1", now=T0 + timedelta(seconds=20)) == []
        assert execution.expire_jobs(now=T0 + timedelta(seconds=20)) == 1
        assert Job.objects.get().status == JobStatus.EXPIRED

    def test_a_repeated_submission_returns_the_job_whatever_its_deadline(self) -> None:
        first = submit_at("same", sub(start_within=10), now=T0)
        again = submit_at("same", sub(start_within=99), now=T0 + timedelta(seconds=1))
        assert not again.created
        assert again.start_by == first.start_by

    def test_bulk_and_staged_submits_keep_their_deadlines(self) -> None:
        results = submit_jobs(
            [(SCOPE, f"b{n}", sub(start_within=5)) for n in range(3)] + [(SCOPE, "none", sub())]
        )
        assert all(result.created for result in results)
        with transaction.atomic():
            stage_job(SCOPE, "staged", sub(start_by=T0))
        deadlines = dict(Job.objects.values_list("job_id", "start_by"))
        assert deadlines["none"] is None
        assert deadlines["staged"] == T0
        assert all(deadlines[f"b{n}"] > timezone.now() for n in range(3))

    def test_an_expired_job_is_finished_for_cancel_and_retry(self) -> None:
        submit_at("gone", sub(start_by=T0), now=T0 - timedelta(seconds=1))
        execution.expire_jobs(now=T0)
        scope = JobScope(SCOPE)
        assert scope.cancel("gone") is CancelOutcome.ALREADY_FINISHED
        with pytest.raises(InvalidTransition):
            scope.retry("gone")

    def test_the_sweep_says_which_jobs_expired(self) -> None:
        seen: list[list[tuple[str, str]]] = []

        def receiver(sender, *, jobs, **kwargs) -> None:
            seen.append(jobs)

        jobs_expired.connect(receiver)
        try:
            submit_at("x", sub(start_by=T0, queue="mail"), now=T0 - timedelta(seconds=1))
            execution.expire_jobs(now=T0)
        finally:
            jobs_expired.disconnect(receiver)
        assert seen == [[("mail", "deadline.work")]]

    def test_the_sweep_takes_the_earliest_deadlines_first_in_batches(self) -> None:
        for n in range(5):
            submit_at(f"e{n}", sub(start_by=T0 + timedelta(seconds=5 - n)), now=T0)
        assert execution.expire_jobs(limit=2, now=T0 + timedelta(minutes=1)) == 2
        left = set(Job.objects.filter(status=JobStatus.QUEUED).values_list("job_id", flat=True))
        assert left == {"e0", "e1", "e2"}


@pytest.mark.django_db(transaction=True)
class TestBadDeadlines:
    @pytest.mark.parametrize(
        "kwargs",
        [
            {"start_by": datetime(2026, 12, 1, 9, 0)},  # naive
            {"start_by": "2026-12-01T09:00:00Z"},
            {"start_within": 0},
            {"start_within": -1},
            {"start_within": math.nan},
            {"start_within": math.inf},
            {"start_within": True},
            {"start_within": 10 * 365 * 86_400 + 1},
            {"start_by": T0, "start_within": 5},
        ],
    )
    def test_a_bad_deadline_is_a_typed_error_and_writes_nothing(self, kwargs) -> None:
        with pytest.raises(InvalidSubmission):
            submit_at("bad", sub(**kwargs))
        assert not Job.objects.exists()
