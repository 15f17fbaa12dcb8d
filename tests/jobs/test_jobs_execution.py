"""The executor's transitions: progress, finishing, cancel, retry, recovery, execution status."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import execution, store
from jobs.exceptions import AttemptRowMissing, InvalidInput, InvalidTransition, JobNotFound
from jobs.models import Job, JobAttempt
from jobs.types import (
    AttemptStatus,
    CancelOutcome,
    ExecutionStatus,
    FinishOutcome,
    JobStatus,
)
from ledon.db import connection_for

FINISHED = [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED]
RETRYABLE = [JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED]


@pytest.mark.django_db
class TestProgress:
    def test_progress_of_the_current_attempt_is_recorded(self, make_job) -> None:
        claim = make_job.running("job-1")
        assert execution.report_progress(claim.token, 40, "halfway") is True
        assert execution.report_progress(claim.token, 40.0, "still halfway") is True

        job = make_job.row("job-1")
        assert (job.progress, job.progress_message) == (40.0, "still halfway")
        [attempt] = make_job.attempts("job-1")
        assert (attempt.progress, attempt.progress_message) == (40.0, "still halfway")
        assert execution.report_progress(claim.token, 100) is True
        assert make_job.get("job-1").progress == 100

    def test_lower_value_changes_nothing(self, make_job, unchanged) -> None:
        claim = make_job.running("job-1")
        execution.report_progress(claim.token, 60, "sixty")
        with unchanged():
            assert execution.report_progress(claim.token, 59.9, "back") is False

    def test_stale_and_unknown_tokens_change_nothing(self, make_job, scope, unchanged) -> None:
        old = make_job.running("job-1", max_attempts=2)
        execution.report_progress(old.token, 10)
        execution.fail(old.token, "boom")
        scope.retry("job-1")
        new = execution.try_start(make_job.scope_hash, "job-1")
        assert new is not None
        execution.report_progress(new.token, 5)
        with unchanged():
            assert execution.report_progress(old.token, 90, "late") is False
            assert execution.report_progress("f" * 32, 90) is False

    def test_no_progress_after_cancel_request(self, make_job, scope, unchanged) -> None:
        claim = make_job.running("job-1")
        execution.report_progress(claim.token, 10)
        assert scope.cancel("job-1") is CancelOutcome.REQUESTED
        with unchanged():
            assert execution.report_progress(claim.token, 20) is False

    @pytest.mark.parametrize("status", FINISHED)
    def test_no_progress_once_finished(self, make_job, unchanged, status: JobStatus) -> None:
        claim = make_job.finished(status, "job-1")
        with unchanged():
            assert execution.report_progress(claim.token, 100) is False

    @pytest.mark.parametrize(
        "value",
        [float("nan"), float("inf"), -1, -0.001, 100.5, 101, True, False, "50", None],
    )
    def test_bad_values_are_rejected(self, make_job, unchanged, value: object) -> None:
        claim = make_job.running("job-1")
        with unchanged(), pytest.raises(InvalidInput):
            execution.report_progress(claim.token, value)  # type: ignore[arg-type]

    @pytest.mark.parametrize("message", ["nul\x00", "\ud800", 5, "x" * 10_001])
    def test_bad_messages_are_rejected(self, make_job, unchanged, message: object) -> None:
        claim = make_job.running("job-1")
        with unchanged(), pytest.raises(InvalidInput):
            execution.report_progress(claim.token, 5, message)  # type: ignore[arg-type]

    @pytest.mark.parametrize("token", ["", None, 7, "x" * 65])
    def test_bad_tokens_are_rejected(self, make_job, unchanged, token: object) -> None:
        make_job.running("job-1")
        with unchanged(), pytest.raises(InvalidInput):
            execution.report_progress(token, 5)  # type: ignore[arg-type]

    def test_missing_attempt_row_fails_the_whole_update(self, make_job) -> None:
        claim = make_job.running("job-1")
        JobAttempt.objects.filter(token=claim.token).delete()
        with pytest.raises(AttemptRowMissing):
            execution.report_progress(claim.token, 50)
        assert make_job.row("job-1").progress is None


@pytest.mark.django_db
class TestFinishing:
    def test_complete_writes_job_and_attempt(self, make_job) -> None:
        claim = make_job.running("job-1")
        execution.report_progress(claim.token, 70)
        now = timezone.now()
        outcome = execution.complete(claim.token, "s3://bucket/report.csv", now=now)
        assert outcome is FinishOutcome.SUCCEEDED
        assert outcome

        job = make_job.row("job-1")
        assert job.status == JobStatus.SUCCEEDED
        assert job.result_ref == "s3://bucket/report.csv"
        assert job.finished_at == now
        assert (job.leased_by, job.lease_expires_at) == ("", None)
        [attempt] = make_job.attempts("job-1")
        assert attempt.status == AttemptStatus.SUCCEEDED
        assert attempt.result_ref == "s3://bucket/report.csv"
        assert attempt.finished_at == now
        assert attempt.progress == 70

    def test_empty_result_is_not_no_result(self, make_job) -> None:
        with_empty = make_job.running("job-1")
        without = make_job.running("job-2")
        execution.complete(with_empty.token, "")
        execution.complete(without.token)
        assert make_job.get("job-1").result_ref == ""
        assert make_job.get("job-2").result_ref is None

    def test_fail_writes_the_error(self, make_job) -> None:
        claim = make_job.running("job-1")
        assert execution.fail(claim.token, "ValueError: bad month") is FinishOutcome.FAILED
        snap = make_job.get("job-1")
        assert (snap.status, snap.error, snap.result_ref) == (
            JobStatus.FAILED,
            "ValueError: bad month",
            None,
        )
        [attempt] = snap.attempts
        assert (attempt.status, attempt.error) == (AttemptStatus.FAILED, "ValueError: bad month")
        assert attempt.finished_at is not None

    def test_fail_with_retry_at_requeues_when_attempts_remain(self, make_job) -> None:
        claim = make_job.running("job-1", max_attempts=2)
        later = timezone.now() + timedelta(minutes=5)
        assert execution.fail(claim.token, "flaky", retry_at=later) is FinishOutcome.REQUEUED
        snap = make_job.get("job-1")
        assert (snap.status, snap.next_run_at, snap.error) == (JobStatus.QUEUED, later, "flaky")
        assert snap.attempts[0].status == AttemptStatus.FAILED
        assert make_job.row("job-1").current_token is None

        last = execution.try_start(make_job.scope_hash, "job-1", now=later)
        assert last is not None
        assert execution.fail(last.token, "again", retry_at=later) is FinishOutcome.FAILED
        assert make_job.get("job-1").status == JobStatus.FAILED

    def test_interrupt_writes_the_reason(self, make_job) -> None:
        claim = make_job.running("job-1", max_attempts=3)
        assert execution.interrupt(claim.token, "shutdown") is FinishOutcome.INTERRUPTED
        snap = make_job.get("job-1")
        assert (snap.status, snap.error) == (JobStatus.INTERRUPTED, "shutdown")
        assert snap.attempts[0].status == AttemptStatus.INTERRUPTED

    @pytest.mark.parametrize(
        ("finish", "attempt_status"),
        [
            (lambda token: execution.fail(token, "stopped"), AttemptStatus.CANCELLED),
            (lambda token: execution.interrupt(token, "stopped"), AttemptStatus.INTERRUPTED),
        ],
        ids=["fail", "interrupt"],
    )
    def test_a_cancel_request_ends_the_job_cancelled_with_the_error(
        self, make_job, scope, finish, attempt_status
    ) -> None:
        claim = make_job.running("job-1", max_attempts=2)
        scope.cancel("job-1")
        assert finish(claim.token) is FinishOutcome.CANCELLED
        snap = make_job.get("job-1")
        assert (snap.status, snap.error, snap.result_ref) == (JobStatus.CANCELLED, "stopped", None)
        [attempt] = snap.attempts
        assert (attempt.status, attempt.error) == (attempt_status, "stopped")

    @pytest.mark.parametrize(
        "finish",
        [
            lambda token: execution.complete(token, "late"),
            lambda token: execution.fail(token, "late"),
            lambda token: execution.interrupt(token, "late"),
            lambda token: execution.recover(token),
        ],
        ids=["complete", "fail", "interrupt", "recover"],
    )
    def test_stale_or_unknown_token_changes_nothing(self, make_job, unchanged, finish) -> None:
        claim = make_job.finished(JobStatus.SUCCEEDED, "job-1")
        with unchanged():
            outcome = finish(claim.token)
            assert outcome is FinishOutcome.STALE
            assert not outcome
            assert finish("0" * 32) is FinishOutcome.STALE

    def test_cancel_before_complete_records_cancelled(self, make_job, scope) -> None:
        claim = make_job.running("job-1")
        assert scope.cancel("job-1") is CancelOutcome.REQUESTED
        assert execution.complete(claim.token, "result.csv") is FinishOutcome.CANCELLED

        snap = make_job.get("job-1")
        assert (snap.status, snap.result_ref) == (JobStatus.CANCELLED, None)
        assert (snap.attempts[0].status, snap.attempts[0].result_ref) == (
            AttemptStatus.CANCELLED,
            None,
        )

    def test_cancel_before_fail_records_cancelled(self, make_job, scope) -> None:
        claim = make_job.running("job-1")
        scope.cancel("job-1")
        assert execution.fail(claim.token, "stopped") is FinishOutcome.CANCELLED
        assert make_job.get("job-1").attempts[0].status == AttemptStatus.CANCELLED

    def test_complete_before_cancel_stays_succeeded(self, make_job, scope, unchanged) -> None:
        claim = make_job.running("job-1")
        assert execution.complete(claim.token, "result.csv") is FinishOutcome.SUCCEEDED
        with unchanged():
            assert scope.cancel("job-1") is CancelOutcome.ALREADY_FINISHED
        snap = make_job.get("job-1")
        assert (snap.status, snap.result_ref, snap.cancel_requested) == (
            JobStatus.SUCCEEDED,
            "result.csv",
            False,
        )

    @pytest.mark.parametrize(
        "finish",
        [
            lambda token: execution.complete(token, "r"),
            lambda token: execution.fail(token, "e"),
            lambda token: execution.interrupt(token),
            lambda token: execution.recover(token),
        ],
        ids=["complete", "fail", "interrupt", "recover"],
    )
    def test_missing_attempt_row_fails_the_transition(self, make_job, unchanged, finish) -> None:
        claim = make_job.running("job-1", max_attempts=2)
        JobAttempt.objects.filter(token=claim.token).delete()
        with unchanged(), pytest.raises(AttemptRowMissing):
            finish(claim.token)
        job = make_job.row("job-1")
        assert (job.status, job.current_token) == (JobStatus.RUNNING, claim.token)

    @pytest.mark.parametrize(
        ("call", "error"),
        [
            (lambda token: execution.complete(token, 5), InvalidInput),
            (lambda token: execution.complete(token, "nul\x00"), InvalidInput),
            (lambda token: execution.fail(token, None), InvalidInput),
            (lambda token: execution.fail(token, "x" * 100_001), InvalidInput),
            (lambda token: execution.fail(token, "e", retry_at="soon"), InvalidInput),
            (lambda token: execution.interrupt(token, "\ud800"), InvalidInput),
            (lambda token: execution.complete("", "r"), InvalidInput),
        ],
    )
    def test_bad_input_is_rejected(self, make_job, unchanged, call, error) -> None:
        claim = make_job.running("job-1")
        with unchanged(), pytest.raises(error):
            call(claim.token)


@pytest.mark.django_db(transaction=True)
class TestCancelCompleteRace:
    def test_the_database_decides_cancel_versus_complete(self, make_job, scope, concurrently):
        seen = set()
        for round_ in range(20):
            claim = make_job.running(f"job-{round_}")
            cancel, complete = concurrently(
                lambda job_id=claim.job_id: scope.cancel(job_id),
                lambda token=claim.token: execution.complete(token, "result.csv"),
            )
            assert (cancel.error, complete.error) == (None, None)
            snap = make_job.get(claim.job_id)
            [attempt] = snap.attempts
            seen.add(snap.status)
            if snap.status == JobStatus.SUCCEEDED:
                assert complete.value is FinishOutcome.SUCCEEDED
                assert cancel.value is CancelOutcome.ALREADY_FINISHED
                assert snap.result_ref == "result.csv"
                assert (attempt.status, attempt.result_ref) == (
                    AttemptStatus.SUCCEEDED,
                    "result.csv",
                )
            else:
                assert snap.status == JobStatus.CANCELLED
                assert complete.value is FinishOutcome.CANCELLED
                assert cancel.value is CancelOutcome.REQUESTED
                assert snap.result_ref is None
                assert (attempt.status, attempt.result_ref) == (AttemptStatus.CANCELLED, None)
        assert seen <= {JobStatus.SUCCEEDED, JobStatus.CANCELLED}

    def test_both_orders_are_consistent(self, make_job, scope, background) -> None:
        # Forces each order once, so both branches of the race above are exercised.
        first = make_job.running("cancel-first")
        scope.cancel("cancel-first")
        assert background(lambda: execution.complete(first.token, "r")).result(30) is (
            FinishOutcome.CANCELLED
        )
        second = make_job.running("complete-first")
        execution.complete(second.token, "r")
        assert background(lambda: scope.cancel("complete-first")).result(30) is (
            CancelOutcome.ALREADY_FINISHED
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres_only
class TestFinishWaitsForCancel:
    def test_complete_blocked_by_an_open_cancel_sees_it(
        self, make_job, background, blocked_on_lock
    ) -> None:
        """A cancel request holding the row makes a concurrent complete wait, then the
        complete sees the committed flag and records Cancelled."""
        claim = make_job.running("job-1")
        flagged = threading.Event()
        release = threading.Event()

        def cancel_and_hold() -> None:
            with transaction.atomic():
                Job.objects.filter(job_id="job-1").update(cancel_requested=True)
                flagged.set()
                assert release.wait(30)

        holder = background(cancel_and_hold)
        assert flagged.wait(30)
        completing = background(lambda: execution.complete(claim.token, "r"))
        blocked_on_lock(1)
        release.set()
        holder.result(30)
        assert completing.result(30) is FinishOutcome.CANCELLED
        assert make_job.get("job-1").result_ref is None


@pytest.mark.django_db
class TestCancel:
    def test_queued_job_is_cancelled_at_once(self, make_job, scope) -> None:
        make_job.queued("job-1")
        assert scope.cancel("job-1") is CancelOutcome.CANCELLED
        snap = make_job.get("job-1")
        assert snap.status == JobStatus.CANCELLED
        assert snap.attempt_count == 0
        assert snap.attempts == ()
        assert snap.finished_at is not None
        assert execution.get_due() == []
        assert execution.try_start(make_job.scope_hash, "job-1") is None

    def test_running_job_only_gets_the_flag(self, make_job, scope) -> None:
        claim = make_job.running("job-1")
        assert scope.cancel("job-1") is CancelOutcome.REQUESTED
        assert scope.cancel("job-1") is CancelOutcome.REQUESTED
        snap = make_job.get("job-1")
        assert (snap.status, snap.cancel_requested) == (JobStatus.RUNNING, True)
        assert snap.attempts[0].status == AttemptStatus.RUNNING
        assert execution.get_execution_status(claim.token) is ExecutionStatus.CANCEL_REQUESTED

    @pytest.mark.parametrize("status", FINISHED)
    def test_finished_job_is_left_as_it_is(self, make_job, scope, unchanged, status) -> None:
        make_job.finished(status, "job-1")
        with unchanged():
            assert scope.cancel("job-1") is CancelOutcome.ALREADY_FINISHED

    def test_unknown_job(self, scope, unchanged) -> None:
        with unchanged(), pytest.raises(JobNotFound):
            scope.cancel("nope")


@pytest.mark.django_db
class TestRetry:
    @pytest.mark.parametrize("status", RETRYABLE)
    def test_retry_requeues_and_clears(self, make_job, scope, status: JobStatus) -> None:
        claim = make_job.running("job-1", max_attempts=2)
        execution.report_progress(claim.token, 30, "thirty")
        if status is JobStatus.CANCELLED:
            scope.cancel("job-1")
            execution.complete(claim.token, "partial.csv")
        elif status is JobStatus.FAILED:
            execution.fail(claim.token, "boom")
        else:
            execution.interrupt(claim.token, "stopped")

        now = timezone.now()
        snap = scope.retry("job-1")
        assert snap.status == JobStatus.QUEUED
        assert now <= snap.next_run_at <= timezone.now()
        job = make_job.row("job-1")
        assert job.status == JobStatus.QUEUED
        assert (job.progress, job.progress_message, job.error) == (None, "", "")
        assert (job.cancel_requested, job.result_ref, job.current_token) == (False, None, None)
        assert (job.finished_at, job.leased_by, job.lease_expires_at) == (None, "", None)
        assert job.attempt_count == 1
        # The earlier attempt stays as it ended.
        [attempt] = make_job.attempts("job-1")
        assert attempt.token == claim.token
        assert attempt.status != AttemptStatus.RUNNING
        assert attempt.progress == 30

    def test_new_attempt_is_numbered_and_fenced(self, make_job, scope, unchanged) -> None:
        old = make_job.running("job-1", max_attempts=3)
        execution.fail(old.token, "boom")
        scope.retry("job-1")
        new = execution.try_start(make_job.scope_hash, "job-1")
        assert new is not None
        assert new.attempt == 2
        assert new.token != old.token

        with unchanged():
            assert execution.report_progress(old.token, 99) is False
            assert execution.complete(old.token, "late") is FinishOutcome.STALE
            assert execution.fail(old.token, "late") is FinishOutcome.STALE
            assert execution.recover(old.token) is FinishOutcome.STALE
            assert execution.get_execution_status(old.token) is ExecutionStatus.ENDED
        assert execution.complete(new.token, "done") is FinishOutcome.SUCCEEDED
        snap = make_job.get("job-1")
        assert [(a.number, a.status) for a in snap.attempts] == [
            (1, AttemptStatus.FAILED),
            (2, AttemptStatus.SUCCEEDED),
        ]
        assert (snap.attempt_count, snap.result_ref) == (2, "done")

    def test_not_before_is_respected(self, make_job, scope) -> None:
        claim = make_job.running("job-1", max_attempts=2)
        execution.fail(claim.token, "boom")
        later = timezone.now() + timedelta(hours=1)
        snap = scope.retry("job-1", not_before=later)
        assert snap.next_run_at == later
        assert execution.get_due() == []
        assert execution.try_start(make_job.scope_hash, "job-1") is None
        assert [d.job_id for d in execution.get_due(now=later)] == ["job-1"]
        assert execution.try_start(make_job.scope_hash, "job-1", now=later) is not None

    @pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.RUNNING, JobStatus.QUEUED])
    def test_other_states_cannot_be_retried(self, make_job, scope, unchanged, status) -> None:
        if status is JobStatus.QUEUED:
            make_job.queued("job-1", max_attempts=3)
        elif status is JobStatus.RUNNING:
            make_job.running("job-1", max_attempts=3)
        else:
            make_job.finished(status, "job-1", max_attempts=3)
        with unchanged(), pytest.raises(InvalidTransition, match=status.value):
            scope.retry("job-1")

    @pytest.mark.parametrize("status", RETRYABLE)
    def test_no_attempts_left(self, make_job, scope, unchanged, status) -> None:
        make_job.finished(status, "job-1", max_attempts=1)
        with unchanged(), pytest.raises(InvalidTransition, match="attempts"):
            scope.retry("job-1")

    def test_max_attempts_counts_claimed_executions_only(self, make_job, scope) -> None:
        make_job.queued("job-1", max_attempts=1)
        scope.cancel("job-1")
        assert scope.retry("job-1").status == JobStatus.QUEUED
        claim = execution.try_start(make_job.scope_hash, "job-1")
        assert claim is not None
        assert claim.attempt == 1

    def test_not_found(self, scope, unchanged) -> None:
        with unchanged(), pytest.raises(JobNotFound):
            scope.retry("nope")

    def test_naive_not_before_is_rejected(self, make_job, scope, unchanged) -> None:
        make_job.finished(JobStatus.FAILED, "job-1", max_attempts=2)
        with unchanged(), pytest.raises(InvalidInput):
            scope.retry("job-1", not_before=timezone.now().replace(tzinfo=None))


@pytest.mark.django_db
class TestRecovery:
    def test_recover_interrupts_and_requeues(self, make_job) -> None:
        claim = make_job.running("job-1", max_attempts=2)
        execution.report_progress(claim.token, 50)
        now = timezone.now()
        assert execution.recover(claim.token, now=now) is FinishOutcome.REQUEUED

        snap = make_job.get("job-1")
        assert (snap.status, snap.next_run_at, snap.progress) == (JobStatus.QUEUED, now, None)
        [attempt] = snap.attempts
        assert attempt.status == AttemptStatus.INTERRUPTED
        assert attempt.error.startswith("recovered")
        assert attempt.finished_at == now
        assert make_job.row("job-1").current_token is None
        # The crash budget: the interrupted attempt used none of the job's attempts.
        assert (snap.attempt_count, snap.interruption_count) == (0, 1)
        again = execution.try_start(make_job.scope_hash, "job-1")
        assert again is not None
        assert again.attempt == 1
        assert [a.number for a in make_job.get("job-1").attempts] == [1, 2]

    def test_without_requeue_the_job_stays_interrupted(self, make_job) -> None:
        claim = make_job.running("job-1", max_attempts=2)
        outcome = execution.recover(claim.token, requeue=False, reason="operator stop")
        assert outcome is FinishOutcome.INTERRUPTED
        snap = make_job.get("job-1")
        assert (snap.status, snap.error) == (JobStatus.INTERRUPTED, "operator stop")
        assert snap.attempts[0].status == AttemptStatus.INTERRUPTED

    def test_cancel_requested_job_is_not_requeued(self, make_job, scope) -> None:
        claim = make_job.running("job-1", max_attempts=2)
        scope.cancel("job-1")
        assert execution.recover(claim.token) is FinishOutcome.CANCELLED
        snap = make_job.get("job-1")
        assert snap.status == JobStatus.CANCELLED
        assert snap.attempts[0].status == AttemptStatus.INTERRUPTED
        assert execution.get_due() == []

    def test_its_only_attempt_is_not_used_up(self, make_job) -> None:
        claim = make_job.running("job-1", max_attempts=1)
        assert execution.recover(claim.token) is FinishOutcome.REQUEUED
        snap = make_job.get("job-1")
        assert (snap.status, snap.attempt_count) == (JobStatus.QUEUED, 0)
        assert [due.job_id for due in execution.get_due()] == ["job-1"]

    def test_recover_expired_touches_only_expired_leases(self, make_job) -> None:
        make_job.queued("old")
        make_job.queued("young")
        t0 = timezone.now()
        old = execution.try_start(make_job.scope_hash, "old", "w1", now=t0, lease_seconds=30)
        young = execution.try_start(
            make_job.scope_hash, "young", "w2", now=t0 + timedelta(seconds=20), lease_seconds=30
        )
        assert old is not None
        assert young is not None

        recovered = execution.recover_expired(now=t0 + timedelta(seconds=35))
        assert recovered == {old.token: FinishOutcome.REQUEUED}
        assert make_job.row("old").status == JobStatus.QUEUED
        assert make_job.row("young").status == JobStatus.RUNNING
        assert execution.recover_expired(now=t0 + timedelta(seconds=49)) == {}
        assert execution.recover_expired(now=t0 + timedelta(seconds=51)) == {
            young.token: FinishOutcome.REQUEUED
        }

    def test_a_lease_renewed_after_listing_is_not_robbed(
        self, make_job, unchanged, monkeypatch
    ) -> None:
        # The expired list is read first; a heartbeat may land before the recovery
        # itself. The recovery's own guard must see the renewed lease.
        make_job.queued("job-1", max_attempts=2)
        t0 = timezone.now()
        claim = execution.try_start(make_job.scope_hash, "job-1", "w1", now=t0, lease_seconds=30)
        assert claim is not None
        execution.heartbeat([claim.token], "w1", lease_seconds=30, now=t0 + timedelta(seconds=25))
        monkeypatch.setattr(store, "expired_tokens", lambda **kwargs: [claim.token])
        with unchanged():
            assert execution.recover_expired(now=t0 + timedelta(seconds=35)) == {
                claim.token: FinishOutcome.STALE
            }

    def test_recovery_guards_do_not_rob_a_live_worker(self, make_job, unchanged) -> None:
        make_job.queued("job-1", max_attempts=2)
        t0 = timezone.now()
        claim = execution.try_start(make_job.scope_hash, "job-1", "w1", now=t0, lease_seconds=30)
        assert claim is not None
        with unchanged():
            assert store.recover(claim.token, lease_expired_before=t0) is FinishOutcome.STALE
            assert store.recover(claim.token, leased_by="w2") is FinishOutcome.STALE
        assert store.recover(claim.token, leased_by="w1") is FinishOutcome.REQUEUED

    def test_a_guard_that_does_not_hold_is_stale_even_without_an_attempt_row(
        self, make_job, unchanged
    ) -> None:
        # Recovery's guards come before the attempt-row check: a live worker's job is
        # left alone; only a job the guards select fails for its missing attempt row.
        make_job.queued("job-1", max_attempts=2)
        t0 = timezone.now()
        claim = execution.try_start(make_job.scope_hash, "job-1", "w1", now=t0, lease_seconds=30)
        assert claim is not None
        JobAttempt.objects.filter(token=claim.token).delete()
        with unchanged():
            assert store.recover(claim.token, lease_expired_before=t0) is FinishOutcome.STALE
            assert store.recover(claim.token, leased_by="w2") is FinishOutcome.STALE
            with pytest.raises(AttemptRowMissing):
                store.recover(claim.token, lease_expired_before=t0 + timedelta(seconds=31))
            with pytest.raises(AttemptRowMissing):
                store.recover(claim.token, leased_by="w1")

    def test_heartbeat_renews_the_lease(self, make_job, scope) -> None:
        make_job.queued("job-1", max_attempts=2)
        t0 = timezone.now()
        claim = execution.try_start(make_job.scope_hash, "job-1", "w1", now=t0, lease_seconds=30)
        assert claim is not None

        states = execution.heartbeat(
            [claim.token], "w1", lease_seconds=30, now=t0 + timedelta(seconds=20)
        )
        assert states == {claim.token: ExecutionStatus.ACTIVE}
        assert make_job.row("job-1").lease_expires_at == t0 + timedelta(seconds=50)
        assert execution.recover_expired(now=t0 + timedelta(seconds=35)) == {}
        assert make_job.row("job-1").status == JobStatus.RUNNING

        # Another worker's heartbeat does not renew, and reports the token as ended.
        assert execution.heartbeat([claim.token], "w2", now=t0 + timedelta(seconds=40)) == {
            claim.token: ExecutionStatus.ENDED
        }
        assert execution.recover_expired(now=t0 + timedelta(seconds=51)) == {
            claim.token: FinishOutcome.REQUEUED
        }
        assert execution.heartbeat([claim.token], "w1") == {claim.token: ExecutionStatus.ENDED}

    def test_heartbeat_reports_cancel_requests(self, make_job, scope) -> None:
        claim = make_job.running("job-1", worker_id="w1")
        scope.cancel("job-1")
        assert execution.heartbeat([claim.token], "w1") == {
            claim.token: ExecutionStatus.CANCEL_REQUESTED
        }

    def test_recover_worker_touches_only_that_worker(self, make_job) -> None:
        mine = make_job.running("mine", worker_id="w1", max_attempts=2)
        also_mine = make_job.running("also-mine", worker_id="w1", max_attempts=2)
        theirs = make_job.running("theirs", worker_id="w2", max_attempts=2)

        recovered = execution.recover_worker("w1")
        assert recovered == {
            mine.token: FinishOutcome.REQUEUED,
            also_mine.token: FinishOutcome.REQUEUED,
        }
        assert make_job.row("theirs").status == JobStatus.RUNNING
        assert make_job.row("theirs").current_token == theirs.token
        assert execution.recover_worker("w1") == {}
        assert execution.recover_worker("w3") == {}


@pytest.mark.django_db
class TestExecutionStatus:
    def test_active_then_cancel_requested_then_ended(self, make_job, scope) -> None:
        claim = make_job.running("job-1")
        assert execution.get_execution_status(claim.token) is ExecutionStatus.ACTIVE
        scope.cancel("job-1")
        assert execution.get_execution_status(claim.token) is ExecutionStatus.CANCEL_REQUESTED
        execution.complete(claim.token)
        assert execution.get_execution_status(claim.token) is ExecutionStatus.ENDED

    @pytest.mark.parametrize("status", FINISHED)
    def test_finished_is_ended(self, make_job, status) -> None:
        claim = make_job.finished(status, "job-1")
        assert execution.get_execution_status(claim.token) is ExecutionStatus.ENDED

    def test_stale_and_unknown_are_ended(self, make_job, scope) -> None:
        old = make_job.running("job-1", max_attempts=2)
        execution.fail(old.token, "boom")
        scope.retry("job-1")
        new = execution.try_start(make_job.scope_hash, "job-1")
        assert new is not None
        assert execution.get_execution_status(old.token) is ExecutionStatus.ENDED
        assert execution.get_execution_status(new.token) is ExecutionStatus.ACTIVE
        assert execution.get_execution_status("0" * 32) is ExecutionStatus.ENDED

    def test_reads_only_the_row_state(self, make_job) -> None:
        claim = make_job.running("job-1")
        with CaptureQueriesContext(connection_for(Job)) as queries:
            execution.get_execution_status(claim.token)
        assert len(queries.captured_queries) == 1
        assert "payload_json" not in queries.captured_queries[0]["sql"]
