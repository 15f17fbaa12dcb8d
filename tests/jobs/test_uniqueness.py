"""Uniqueness and debounce at submit: one job per (scope, unique key) while it is
Queued, Queued or Running, or for a time; a debounced burst is one job, due once the
burst is quiet, with the latest payload — decided by the database, so racing submits
from several connections still make one job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from jobs import (
    JobScope,
    JobSnapshot,
    JobStatus,
    JobSubmission,
    execution,
    stage_job,
    store,
    submit_job,
)
from jobs.api import submit_jobs
from jobs.exceptions import InvalidSubmission
from jobs.models import Job, UniqueHold

SCOPE = "tenant-unique"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def sub(payload: object = None, **kwargs) -> JobSubmission:
    return JobSubmission.create("unique.work", payload or {"n": 1}, **kwargs)


def submit_at(job_id: str, submission: JobSubmission, now: datetime, scope: str = SCOPE):
    return store.submit(JobScope(scope).scope_hash, job_id, submission, now=now)


def jobs() -> list[tuple[str, str]]:
    return list(Job.objects.order_by("id").values_list("job_id", "status"))


@pytest.mark.django_db(transaction=True)
class TestUniqueWhile:
    def test_while_queued_a_second_submission_returns_the_first_job(self) -> None:
        first = submit_job(SCOPE, "a", sub(unique_key="sync:42"))
        second = submit_job(SCOPE, "b", sub({"n": 2}, unique_key="sync:42"))
        assert first.created
        assert not second.created
        assert (second.job_id, second.payload) == ("a", {"n": 1})
        assert second.unique_key == "sync:42"
        assert jobs() == [("a", "queued")]
        # Once it is claimed, the key is free again.
        execution.claim_due("w1")
        third = submit_job(SCOPE, "c", sub(unique_key="sync:42"))
        assert third.created
        assert jobs() == [("a", "running"), ("c", "queued")]

    def test_while_active_the_key_is_held_until_the_job_finishes(self) -> None:
        submit_job(SCOPE, "a", sub(unique_key="k", unique_while="active"))
        (claim,) = execution.claim_due("w1")
        assert submit_job(SCOPE, "b", sub(unique_key="k", unique_while="active")).job_id == "a"
        execution.complete(claim.token)
        assert submit_job(SCOPE, "b", sub(unique_key="k", unique_while="active")).created

    def test_the_key_counts_within_its_scope(self) -> None:
        submit_job(SCOPE, "a", sub(unique_key="k"))
        assert submit_job("tenant-other", "a", sub(unique_key="k")).created

    def test_the_same_job_id_follows_the_identity_rule(self) -> None:
        submit_job(SCOPE, "a", sub(unique_key="k"))
        again = submit_job(SCOPE, "a", sub(unique_key="k"))
        assert not again.created
        assert again.job_id == "a"

    def test_racing_submits_of_one_key_create_one_job(self, concurrently) -> None:
        outcomes = concurrently(
            *(lambda n=n: submit_job(SCOPE, f"r{n}", sub(unique_key="race")) for n in range(6))
        )
        assert all(outcome.error is None for outcome in outcomes), outcomes
        assert Job.objects.count() == 1
        winner = Job.objects.get().job_id
        snapshots: list[JobSnapshot] = [outcome.value for outcome in outcomes]
        assert {snap.job_id for snap in snapshots} == {winner}
        assert sum(snap.created for snap in snapshots) == 1

    def test_a_staged_job_holds_its_key_only_if_its_transaction_commits(self) -> None:
        def business() -> None:
            with transaction.atomic():
                stage_job(SCOPE, "s", sub(unique_key="k"))
                raise RuntimeError("business failure")

        with pytest.raises(RuntimeError):
            business()
        assert not Job.objects.exists()
        with transaction.atomic():
            staged = stage_job(SCOPE, "s", sub(unique_key="k"))
            again = stage_job(SCOPE, "t", sub(unique_key="k"))
        assert staged.created
        assert again.job_id == "s"
        assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
class TestUniqueFor:
    def test_the_key_is_held_for_its_time_whatever_the_state(self) -> None:
        first = submit_at("a", sub(unique_key="k", unique_for=60), T0)
        (claim,) = execution.claim_due("w1", now=T0)
        execution.complete(claim.token, now=T0)
        held = submit_at("b", sub(unique_key="k", unique_for=60), T0 + timedelta(seconds=59))
        assert first.created
        assert held.job_id == "a"
        assert not held.created
        later = submit_at("b", sub(unique_key="k", unique_for=60), T0 + timedelta(seconds=60))
        assert later.created
        hold = UniqueHold.objects.get()
        assert (hold.job_id, hold.until) == ("b", T0 + timedelta(seconds=120))

    def test_racing_submits_within_the_time_create_one_job(self, concurrently) -> None:
        outcomes = concurrently(
            *(
                lambda n=n: submit_job(SCOPE, f"r{n}", sub(unique_key="k", unique_for=60))
                for n in range(6)
            )
        )
        assert all(outcome.error is None for outcome in outcomes), outcomes
        assert Job.objects.count() == 1
        assert len({outcome.value.job_id for outcome in outcomes}) == 1


@pytest.mark.django_db(transaction=True)
class TestDebounce:
    def test_a_burst_is_one_job_due_after_the_last_submission(self) -> None:
        first = submit_at("a", sub({"v": 1}, unique_key="k", debounce=5), T0)
        assert first.created
        assert first.next_run_at == T0 + timedelta(seconds=5)
        second = submit_at(
            "b", sub({"v": 2}, unique_key="k", debounce=5), T0 + timedelta(seconds=3)
        )
        assert (second.job_id, second.created) == ("a", False)
        assert second.payload == {"v": 2}
        assert second.next_run_at == T0 + timedelta(seconds=8)
        assert execution.claim_due("w1", now=T0 + timedelta(seconds=7)) == []
        (claim,) = execution.claim_due("w1", now=T0 + timedelta(seconds=8))
        assert claim.payload == {"v": 2}

    def test_debounce_max_bounds_the_delay_from_the_first_submission(self) -> None:
        bounded = {"unique_key": "k", "debounce": 5, "debounce_max": 12}
        submit_at("a", sub({"v": 1}, **bounded), T0)
        for n, second in enumerate((4, 8, 11), start=2):
            job = submit_at(f"x{n}", sub({"v": n}, **bounded), T0 + timedelta(seconds=second))
        assert job.next_run_at == T0 + timedelta(seconds=12)
        assert job.payload == {"v": 4}
        assert Job.objects.count() == 1

    def test_a_claimed_job_is_not_replaced_the_next_burst_gets_a_job(self) -> None:
        submit_at("a", sub({"v": 1}, unique_key="k", debounce=5), T0)
        (claim,) = execution.claim_due("w1", now=T0 + timedelta(seconds=5))
        later = submit_at("b", sub({"v": 2}, unique_key="k", debounce=5), T0 + timedelta(seconds=6))
        assert later.created
        assert later.job_id == "b"
        assert JobScope(SCOPE).get("a").payload == {"v": 1}
        assert claim.payload == {"v": 1}

    def test_racing_debounced_submits_make_one_job(self, concurrently) -> None:
        outcomes = concurrently(
            *(
                lambda n=n: submit_job(SCOPE, f"r{n}", sub({"v": n}, unique_key="k", debounce=30))
                for n in range(6)
            )
        )
        assert all(outcome.error is None for outcome in outcomes), outcomes
        assert Job.objects.count() == 1
        assert Job.objects.get().status == JobStatus.QUEUED


@pytest.mark.django_db(transaction=True)
class TestBadUniqueInput:
    @pytest.mark.parametrize(
        "kwargs",
        [
            {"unique_key": ""},
            {"unique_key": "x" * 201},
            {"unique_key": "bad\x00key"},
            {"unique_key": 42},
            {"unique_while": "queued"},
            {"unique_for": 60},
            {"debounce": 5},
            {"unique_key": "k", "unique_while": "running"},
            {"unique_key": "k", "unique_for": 60, "unique_while": "queued"},
            {"unique_key": "k", "debounce_max": 60},
            {"unique_key": "k", "debounce": 0},
            {"unique_key": "k", "debounce": 5, "unique_for": 60},
            {"unique_key": "k", "debounce": 5, "not_before": T0},
        ],
    )
    def test_bad_rules_are_typed_errors_that_write_nothing(self, kwargs) -> None:
        with pytest.raises(InvalidSubmission):
            submit_job(SCOPE, "bad", sub(**kwargs))
        assert not Job.objects.exists()

    def test_a_bulk_submit_refuses_unique_keys_and_writes_nothing(self) -> None:
        with pytest.raises(InvalidSubmission):
            submit_jobs([(SCOPE, "a", sub()), (SCOPE, "b", sub(unique_key="k"))])
        assert not Job.objects.exists()
