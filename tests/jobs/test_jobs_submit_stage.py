"""Independent submit (its own transaction) and staged submit (the caller's)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from jobs.api import JobScope, stage_job, submit_job
from jobs.exceptions import (
    AmbientTransactionError,
    JobIdentityConflict,
    JobIdentityUnresolved,
    TransactionRequiredError,
)
from jobs.models import Job
from jobs.store import submission
from jobs.types import JobSnapshot
from tests.support.factories import JobSubmissionFactory

SCOPE = "tenant-42"
TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "START")


def job_count_elsewhere(background: Callable[..., Any]) -> int:
    """The number of jobs another connection can see (committed rows only)."""
    return background(lambda: Job.objects.count()).result(30)


def transaction_control(queries: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].upper().startswith(TRANSACTION_CONTROL)
    ]


@pytest.mark.django_db
class TestIndependentSubmit:
    def test_refuses_inside_atomic_and_writes_nothing(self, scope) -> None:
        with transaction.atomic():
            with pytest.raises(AmbientTransactionError, match="stage_job"):
                submit_job(SCOPE, "job-1", JobSubmissionFactory())
            with pytest.raises(AmbientTransactionError):
                scope.submit("job-1", JobSubmissionFactory())
            with transaction.atomic(), pytest.raises(AmbientTransactionError):
                submit_job(SCOPE, "job-1", JobSubmissionFactory())
        assert Job.objects.count() == 0

    def test_the_test_case_transaction_is_not_ambient(self) -> None:
        # Like atomic(durable=True): the transaction pytest-django wraps around a test
        # is not the caller's, so code calling submit_job can be tested normally.
        assert connection.in_atomic_block
        assert submit_job(SCOPE, "job-1", JobSubmissionFactory()).created

    def test_duplicate_returns_the_existing_job(self) -> None:
        first = submit_job(SCOPE, "job-1", JobSubmissionFactory())
        second = submit_job(SCOPE, "job-1", JobSubmissionFactory())
        third = JobScope(SCOPE).submit("job-1", JobSubmissionFactory())
        assert first.created is True
        assert second.created is False
        assert third.created is False
        assert second == JobSnapshot(**{**_fields(first), "created": False})
        assert Job.objects.count() == 1

    def test_conflict_changes_nothing(self, unchanged) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        with unchanged(), pytest.raises(JobIdentityConflict):
            submit_job(SCOPE, "job-1", JobSubmissionFactory(queue="other"))

    def test_a_winner_that_cannot_be_found_is_a_typed_error(self, monkeypatch) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        monkeypatch.setattr(submission, "_existing_or_conflict", lambda *args: None)
        with pytest.raises(JobIdentityUnresolved, match=r"'job-1'.*submit again") as raised:
            submit_job(SCOPE, "job-1", JobSubmissionFactory())
        assert raised.value.job_ids == ("job-1",)
        assert Job.objects.count() == 1


def _fields(snap: JobSnapshot) -> dict[str, Any]:
    return {name: getattr(snap, name) for name in JobSnapshot.__dataclass_fields__}


@pytest.mark.django_db(transaction=True)
class TestIndependentSubmitCommits:
    def test_refuses_inside_a_real_transaction(self) -> None:
        with transaction.atomic(), pytest.raises(AmbientTransactionError):
            submit_job(SCOPE, "job-1", JobSubmissionFactory())
        assert Job.objects.count() == 0

    def test_commits_on_its_own(self, background) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        assert job_count_elsewhere(background) == 1

    def test_identical_concurrent_requests_make_exactly_one_job(self, concurrently) -> None:
        outcomes = concurrently(
            *[lambda: submit_job(SCOPE, "job-1", JobSubmissionFactory()) for _ in range(8)]
        )
        assert [o.error for o in outcomes] == [None] * 8
        assert sorted(o.value.created for o in outcomes) == [False] * 7 + [True]
        assert Job.objects.count() == 1

    def test_different_concurrent_requests_have_exactly_one_winner(self, concurrently) -> None:
        def submitter(n: int) -> Callable[[], JobSnapshot]:
            return lambda: submit_job(SCOPE, "job-1", JobSubmissionFactory(payload={"n": n}))

        outcomes = concurrently(*[submitter(n) for n in range(8)])
        winners = [o.value for o in outcomes if o.error is None]
        losers = [o.error for o in outcomes if o.error is not None]
        assert len(winners) == 1
        assert winners[0].created
        assert len(losers) == 7
        for error in losers:
            assert isinstance(error, JobIdentityConflict)
            assert error.fields == ("payload_json",)
        assert Job.objects.get().payload_json == winners[0].payload_json


@pytest.mark.django_db
class TestStagedSubmit:
    def test_requires_atomic_and_writes_nothing(self, scope) -> None:
        with pytest.raises(TransactionRequiredError, match="submit_job"):
            stage_job(SCOPE, "job-1", JobSubmissionFactory())
        with pytest.raises(TransactionRequiredError):
            scope.stage("job-1", JobSubmissionFactory())
        assert Job.objects.count() == 0

    def test_uses_the_callers_connection_without_transaction_control(self) -> None:
        with transaction.atomic():
            raw = connection.connection
            with CaptureQueriesContext(connection) as queries:
                snap = stage_job(SCOPE, "job-1", JobSubmissionFactory())
                stage_job(SCOPE, "job-1", JobSubmissionFactory())
            assert snap.created
            assert connection.connection is raw
            assert any("INSERT" in q["sql"].upper() for q in queries.captured_queries)
            assert transaction_control(queries) == []
            assert not transaction.get_rollback()
            # Control: the capture does see transaction control when there is some.
            with CaptureQueriesContext(connection) as control, transaction.atomic():
                pass
            assert transaction_control(control)

    def test_identical_request_staged_twice_returns_the_first(self) -> None:
        with transaction.atomic():
            first = stage_job(SCOPE, "job-1", JobSubmissionFactory())
            second = stage_job(SCOPE, "job-1", JobSubmissionFactory())
        assert first.created is True
        assert second.created is False
        assert second.created_at == first.created_at
        assert Job.objects.count() == 1

    def test_identical_request_for_a_committed_job_returns_it(self) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        with transaction.atomic():
            User.objects.create(username="alice")
            snap = stage_job(SCOPE, "job-1", JobSubmissionFactory())
        assert snap.created is False
        assert User.objects.filter(username="alice").exists()


@pytest.mark.django_db(transaction=True)
class TestStagedSubmitCommits:
    def test_requires_a_real_transaction(self) -> None:
        with pytest.raises(TransactionRequiredError):
            stage_job(SCOPE, "job-1", JobSubmissionFactory())
        assert Job.objects.count() == 0

    def test_job_exists_once_the_transaction_commits(self, background) -> None:
        with transaction.atomic():
            User.objects.create(username="alice")
            snap = stage_job(SCOPE, "job-1", JobSubmissionFactory())
            assert snap.created
            assert job_count_elsewhere(background) == 0
        assert job_count_elsewhere(background) == 1
        assert User.objects.count() == 1

    def test_no_job_when_the_transaction_rolls_back(self) -> None:
        class BusinessError(Exception):
            pass

        def place_order() -> None:
            with transaction.atomic():
                User.objects.create(username="alice")
                stage_job(SCOPE, "job-1", JobSubmissionFactory())
                raise BusinessError

        with pytest.raises(BusinessError):
            place_order()
        assert Job.objects.count() == 0
        assert User.objects.count() == 0

    def test_conflict_rolls_back_business_rows_even_if_caught(self, unchanged) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        with unchanged(), transaction.atomic():
            User.objects.create(username="alice")
            with pytest.raises(JobIdentityConflict):
                stage_job(SCOPE, "job-1", JobSubmissionFactory(payload={"month": "2026-12"}))
            assert transaction.get_rollback()
            # The transaction is poisoned: no more work can ride along.
            with pytest.raises(TransactionManagementError):
                User.objects.create(username="bob")
        assert User.objects.count() == 0

    def test_a_winner_that_cannot_be_found_rolls_back_business_rows(
        self, monkeypatch, unchanged
    ) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        monkeypatch.setattr(submission, "_existing_or_conflict", lambda *args: None)
        with unchanged(), transaction.atomic():
            User.objects.create(username="alice")
            with pytest.raises(JobIdentityUnresolved):
                stage_job(SCOPE, "job-1", JobSubmissionFactory())
            assert transaction.get_rollback()
        assert User.objects.count() == 0

    def test_conflict_with_a_job_staged_earlier_in_the_transaction(self) -> None:
        with transaction.atomic():
            User.objects.create(username="alice")
            stage_job(SCOPE, "job-1", JobSubmissionFactory())
            with pytest.raises(JobIdentityConflict):
                stage_job(SCOPE, "job-1", JobSubmissionFactory(max_attempts=2))
        assert Job.objects.count() == 0
        assert User.objects.count() == 0

    @pytest.mark.postgres_only
    @pytest.mark.parametrize(
        ("second_payload", "first_commits"),
        [
            pytest.param(1, True, id="same-request-first-commits"),
            pytest.param(2, True, id="different-request-first-commits"),
            pytest.param(1, False, id="same-request-first-rolls-back"),
            pytest.param(2, False, id="different-request-first-rolls-back"),
        ],
    )
    def test_two_transactions_stage_the_same_id(
        self, background, blocked_on_lock, second_payload: int, first_commits: bool
    ) -> None:
        staged = threading.Event()
        release = threading.Event()

        def first() -> JobSnapshot:
            with transaction.atomic():
                User.objects.create(username="first")
                snap = stage_job(SCOPE, "job-1", JobSubmissionFactory(payload=1))
                staged.set()
                assert release.wait(30)
                if not first_commits:
                    transaction.set_rollback(True)
            return snap

        def second() -> JobSnapshot:
            assert staged.wait(30)
            with transaction.atomic():
                User.objects.create(username="second")
                return stage_job(SCOPE, "job-1", JobSubmissionFactory(payload=second_payload))

        first_result = background(first)
        second_result = background(second)
        blocked_on_lock(1)  # the second transaction waits for the first one's row
        release.set()
        assert first_result.result(30).created

        users = lambda: set(User.objects.values_list("username", flat=True))  # noqa: E731
        if first_commits and second_payload == 1:
            assert second_result.result(30).created is False
            assert users() == {"first", "second"}
            assert Job.objects.get().payload_json == "1"
        elif first_commits:
            with pytest.raises(JobIdentityConflict):
                second_result.result(30)
            assert users() == {"first"}
            assert Job.objects.get().payload_json == "1"
        else:
            assert second_result.result(30).created is True
            assert users() == {"second"}
            assert Job.objects.get().payload_json == str(second_payload)


@pytest.mark.django_db(transaction=True)
class TestStageMany:
    """``store.stage_many``: the library's bulk stage (the workflow engine queues a
    map's item jobs with it), inside the caller's transaction."""

    def items(self, *job_ids: str, **sub: Any) -> list[tuple[str, str, Any]]:
        scope_hash = JobScope(SCOPE).scope_hash
        return [(scope_hash, job_id, JobSubmissionFactory(**sub)) for job_id in job_ids]

    def test_requires_the_callers_transaction(self) -> None:
        with pytest.raises(TransactionRequiredError):
            submission.stage_many(self.items("a"))
        assert Job.objects.count() == 0

    def test_creates_the_jobs_in_one_insert_and_only_if_the_caller_commits(self) -> None:
        with contextlib.suppress(RuntimeError), transaction.atomic():
            submission.stage_many(self.items("a", "b"))
            raise RuntimeError("the caller's work failed")
        assert Job.objects.count() == 0
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            results = submission.stage_many(self.items("a", "b", "c"))
        assert [r.created for r in results] == [True, True, True]
        inserts = [q for q in queries if q["sql"].upper().startswith("INSERT INTO JOBS_JOB ")]
        assert len(inserts) == 1
        assert sorted(Job.objects.values_list("job_id", flat=True)) == ["a", "b", "c"]

    def test_the_same_request_again_is_the_stored_job_and_another_is_a_conflict(self) -> None:
        sub = JobSubmissionFactory()
        scope_hash = JobScope(SCOPE).scope_hash
        with transaction.atomic():
            submission.stage_many([(scope_hash, "a", sub)])
        with transaction.atomic():
            again = submission.stage_many([(scope_hash, "a", sub), (scope_hash, "b", sub)])
        assert [r.created for r in again] == [False, True]
        with pytest.raises(JobIdentityConflict), transaction.atomic():
            submission.stage_many(
                [(scope_hash, "c", sub), (scope_hash, "a", JobSubmissionFactory(priority=9))]
            )
        # The conflict rolled the caller's transaction back: "c" was not created.
        assert sorted(Job.objects.values_list("job_id", flat=True)) == ["a", "b"]
