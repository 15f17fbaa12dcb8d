"""Snoozing is bounded: a job may ``raise Snooze`` at most ``max_snoozes`` times
(``@job_handler(max_snoozes=N)``, default ``JOBS["MAX_SNOOZES"]``); the attempt that
asks once more ends Failed naming the bound. ``JobSnapshot.snooze_count`` says how
many it took."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import JobScope, JobStatus, JobSubmission, execution, submit_job
from jobs.conf import jobs_settings
from jobs.exceptions import InvalidInput, JobsConfigurationError
from jobs.handlers import Snooze, job_handler
from jobs.testing import run_jobs_inline
from jobs.types import AttemptStatus, FinishOutcome

SCOPE = "tenant-snooze"

pytestmark = pytest.mark.django_db(transaction=True)


def sleepy(handler, name: str, **options):
    @handler(name, **options)
    def run(ctx):
        raise Snooze(0)

    return run


def test_the_default_bound_is_the_setting() -> None:
    assert jobs_settings().MAX_SNOOZES == 100


def test_past_its_max_snoozes_the_attempt_ends_failed_naming_the_bound(handler) -> None:
    sleepy(handler, "snooze.bounded", max_snoozes=2)
    submit_job(SCOPE, "j", JobSubmission.create("snooze.bounded", max_attempts=3))
    now = timezone.now()
    # Snooze(0) is due again at once: one inline run takes every execution.
    outcomes = [run.outcome for run in run_jobs_inline(now=now)]
    assert outcomes == [FinishOutcome.SNOOZED, FinishOutcome.SNOOZED, FinishOutcome.FAILED]
    snap = JobScope(SCOPE).get("j")
    assert (snap.status, snap.snooze_count, snap.attempt_count) == (JobStatus.FAILED, 2, 1)
    assert "snoozed 2 times" in snap.error
    assert "max_snoozes=2" in snap.error
    assert [a.status for a in snap.attempts] == [
        AttemptStatus.SNOOZED,
        AttemptStatus.SNOOZED,
        AttemptStatus.FAILED,
    ]
    assert run_jobs_inline(now=now + timedelta(seconds=10)) == []


def test_the_setting_bounds_handlers_without_their_own(handler, settings) -> None:
    settings.JOBS = {**settings.JOBS, "MAX_SNOOZES": 1}
    sleepy(handler, "snooze.default")
    submit_job(SCOPE, "j", JobSubmission.create("snooze.default"))
    outcomes = [run.outcome for run in run_jobs_inline()]
    assert outcomes == [FinishOutcome.SNOOZED, FinishOutcome.FAILED]
    assert JobScope(SCOPE).get("j").snooze_count == 1


def test_zero_allows_no_snooze(make_job) -> None:
    claim = make_job.running("z")
    assert execution.snooze(claim.token, timezone.now(), max_snoozes=0) is FinishOutcome.FAILED
    assert "max_snoozes=0" in make_job.get("z").error


def test_a_cancel_requested_first_still_ends_cancelled_past_the_bound(make_job) -> None:
    claim = make_job.running("c")
    JobScope(make_job.scope).cancel("c")
    assert execution.snooze(claim.token, timezone.now(), max_snoozes=0) is FinishOutcome.CANCELLED
    assert make_job.get("c").error == ""


def test_a_stale_token_past_the_bound_changes_nothing(make_job, unchanged) -> None:
    claim = make_job.running("s")
    execution.complete(claim.token, None)
    with unchanged():
        assert execution.snooze(claim.token, timezone.now(), max_snoozes=0) is FinishOutcome.STALE


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3", 10**7])
def test_bad_bounds_are_typed(make_job, unchanged, bad) -> None:
    claim = make_job.running("b")
    with unchanged(), pytest.raises(InvalidInput):
        execution.snooze(claim.token, timezone.now(), max_snoozes=bad)
    with pytest.raises(JobsConfigurationError, match="max_snoozes"):
        job_handler("snooze.bad", max_snoozes=bad)


@pytest.mark.parametrize("bad", [-1, True, None, "100"])
def test_the_setting_is_an_int(settings, bad) -> None:
    settings.JOBS = {**settings.JOBS, "MAX_SNOOZES": bad}
    with pytest.raises(JobsConfigurationError, match="MAX_SNOOZES"):
        jobs_settings()


def test_a_new_job_has_no_snoozes() -> None:
    snap = submit_job(SCOPE, "n", JobSubmission.create("x.y"))
    assert snap.snooze_count == 0
    assert JobScope(SCOPE).get("n").snooze_count == 0


def test_the_metrics_count_a_snooze_under_its_own_outcome() -> None:
    from jobs.observability.metrics import outcome_label

    assert outcome_label(FinishOutcome.SNOOZED, retry_scheduled=False) == "snoozed"
