"""Bulk submit (``submit_jobs``: each item compared and created as ``submit_job``
would, one transaction per call) and batched completion (``complete_many``,
``complete_and_claim``: each token finished by the finish rules, one commit)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import SubmitResult, execution, stage_job, submit_job, submit_jobs
from jobs.api import JobScope
from jobs.exceptions import (
    AmbientTransactionError,
    AttemptRowMissing,
    InvalidInput,
    InvalidJobId,
    InvalidScope,
    InvalidSubmission,
    JobIdentityConflict,
    JobIdentityUnresolved,
)
from jobs.models import Job, JobAttempt
from jobs.store import finishing, submission
from jobs.types import IDENTITY_FIELDS, CancelOutcome, FinishOutcome, JobSnapshot, JobStatus
from tests.support.factories import JobSubmissionFactory

SCOPE = "tenant-42"
OTHER = "tenant-7"


def fields(snap: JobSnapshot) -> dict[str, Any]:
    return {name: getattr(snap, name) for name in JobSnapshot.__dataclass_fields__}


def stored(scope: str, job_id: str) -> JobSnapshot:
    snap = JobScope(scope).get(job_id)
    assert snap is not None
    return snap


@pytest.mark.django_db
class TestBulkSubmit:
    def test_creates_every_job_and_reports_each_in_order(self) -> None:
        items = [(SCOPE, f"job-{n}", JobSubmissionFactory(payload={"n": n})) for n in range(5)]
        results = submit_jobs(items)
        assert [r.job_id for r in results] == [f"job-{n}" for n in range(5)]
        assert all(r.created and r.conflict is None for r in results)
        for n, result in enumerate(results):
            snap = result.job()
            assert snap.payload == {"n": n}
            assert snap.status == JobStatus.QUEUED
            assert fields(snap) == {**fields(stored(SCOPE, f"job-{n}")), "created": True}
        assert Job.objects.count() == 5

    def test_returns_what_submit_job_returns_for_the_same_request(self) -> None:
        now = timezone.now()
        later = now + timedelta(hours=1)
        sub = JobSubmissionFactory(not_before=later, priority=5, max_attempts=3, queue="q")
        [result] = submit_jobs([(SCOPE, "job-1", sub)])
        single = submit_job(SCOPE, "job-1", sub)
        assert single.created is False
        assert fields(single) == {**fields(result.job()), "created": False}
        assert result.job().next_run_at == later
        assert result.job().initial_not_before == later

    def test_scopes_are_kept_apart(self) -> None:
        results = submit_jobs(
            [(SCOPE, "job-1", JobSubmissionFactory()), (OTHER, "job-1", JobSubmissionFactory())]
        )
        assert [r.created for r in results] == [True, True]
        assert results[0].job().scope_hash != results[1].job().scope_hash
        assert [s.job_id for s in JobScope(OTHER).list()] == ["job-1"]

    def test_generated_job_ids(self) -> None:
        results = submit_jobs([(SCOPE, None, JobSubmissionFactory()) for _ in range(3)])
        assert len({r.job_id for r in results}) == 3
        assert Job.objects.count() == 3

    def test_identical_request_for_an_existing_job_returns_it(self) -> None:
        first = submit_job(SCOPE, "job-1", JobSubmissionFactory())
        [result] = submit_jobs([(SCOPE, "job-1", JobSubmissionFactory())])
        assert result.created is False
        assert result.conflict is None
        assert fields(result.job()) == {**fields(first), "created": False}
        assert Job.objects.count() == 1

    def test_different_request_for_an_existing_job_is_reported_not_raised(
        self, unchanged: Callable[[], Any]
    ) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        results = submit_jobs(
            [
                (SCOPE, "job-1", JobSubmissionFactory(queue="other", max_attempts=2)),
                (SCOPE, "job-2", JobSubmissionFactory()),
            ]
        )
        conflict = results[0].conflict
        assert isinstance(conflict, JobIdentityConflict)
        assert conflict.job_id == "job-1"
        assert conflict.fields == ("queue", "max_attempts")
        assert results[0].snapshot is None
        assert results[0].created is False
        with pytest.raises(JobIdentityConflict):
            results[0].job()
        # The conflict changed nothing and did not stop the other item.
        assert results[1].created
        assert stored(SCOPE, "job-1").queue == "default"
        assert Job.objects.count() == 2

    def test_repeated_identity_within_the_batch_behaves_like_repeated_calls(self) -> None:
        results = submit_jobs(
            [
                (SCOPE, "job-1", JobSubmissionFactory()),
                (SCOPE, "job-2", JobSubmissionFactory()),
                (SCOPE, "job-1", JobSubmissionFactory()),
                (SCOPE, "job-1", JobSubmissionFactory(payload={"month": "2026-12"})),
            ]
        )
        assert [r.created for r in results] == [True, True, False, False]
        assert fields(results[2].job()) == {**fields(results[0].job()), "created": False}
        assert isinstance(results[3].conflict, JobIdentityConflict)
        assert results[3].conflict.fields == ("payload_json",)
        assert Job.objects.count() == 2
        assert stored(SCOPE, "job-1").payload == {"month": "2026-11"}

    def test_repeat_of_an_item_that_conflicted_is_compared_with_the_stored_job(self) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        results = submit_jobs(
            [
                (SCOPE, "job-1", JobSubmissionFactory(priority=3)),
                (SCOPE, "job-1", JobSubmissionFactory()),
            ]
        )
        assert isinstance(results[0].conflict, JobIdentityConflict)
        assert results[1].conflict is None
        assert results[1].created is False

    def test_the_payload_text_is_compared_byte_for_byte(self) -> None:
        from jobs.types import JobSubmission

        spaced = JobSubmission(handler="reports.generate", payload_json='{"a": 1}')
        compact = JobSubmission(handler="reports.generate", payload_json='{"a":1}')
        results = submit_jobs([(SCOPE, "job-1", spaced), (SCOPE, "job-1", compact)])
        assert results[0].created
        assert isinstance(results[1].conflict, JobIdentityConflict)

    def test_every_value_is_stored_as_given(self) -> None:
        """The batch travels as one JSON document on PostgreSQL: text that needs
        escaping, non-ASCII text, a not-before time and every number arrive as given,
        and each job reads back as the snapshot submit_jobs returned."""
        from jobs.types import JobSubmission

        later = timezone.now() + timedelta(hours=3, microseconds=123_456)
        texts = [
            '{"quote":"\\"","backslash":"\\\\","nul":"\\u0000","tab":"\\t"}',
            '{"text": "Grüße — 東京 🎉", "line": "a\\nb"}',
            "[1, 2.5e-7, null, true]",
        ]
        items = [
            (
                SCOPE,
                f"job-{n}",
                JobSubmission(
                    handler="reports.generate",
                    handler_version=n + 2,
                    payload_json=text,
                    queue=f"queue-{n}",
                    priority=-n,
                    max_attempts=n + 1,
                    initial_not_before=later if n == 1 else None,
                ),
            )
            for n, text in enumerate(texts)
        ]
        results = submit_jobs(items)
        for (_, job_id, sub), result in zip(items, results, strict=True):
            snap = stored(SCOPE, job_id)
            assert snap.payload_json == sub.payload_json
            assert snap.submission() == sub
            assert fields(snap) == {**fields(result.job()), "created": False}
        assert stored(SCOPE, "job-1").next_run_at == later
        assert stored(SCOPE, "job-0").next_run_at == stored(SCOPE, "job-0").created_at

    def test_many_items_span_several_statements(self) -> None:
        count = 1_234
        sub = JobSubmissionFactory()
        results = submit_jobs([(SCOPE, f"job-{n}", sub) for n in range(count)])
        assert sum(r.created for r in results) == count
        assert Job.objects.count() == count
        again = submit_jobs([(SCOPE, f"job-{n}", sub) for n in range(count)])
        assert not any(r.created or r.conflict for r in again)

    def test_mixed_created_existing_and_conflicting_items_in_one_batch(self) -> None:
        kept = JobSubmissionFactory(payload={"kept": True})
        submit_jobs([(SCOPE, "old-same", kept), (SCOPE, "old-other", kept)])
        before = {job_id: stored(SCOPE, job_id) for job_id in ("old-same", "old-other")}
        other = JobSubmissionFactory(payload={"kept": False}, priority=3)
        results = submit_jobs(
            [
                (SCOPE, "new-1", JobSubmissionFactory(payload={"n": 1})),
                (SCOPE, "old-same", kept),
                (SCOPE, "old-other", other),
                (SCOPE, "new-2", JobSubmissionFactory(payload={"n": 2})),
            ]
        )
        assert [(r.job_id, r.created, r.conflict is not None) for r in results] == [
            ("new-1", True, False),
            ("old-same", False, False),
            ("old-other", False, True),
            ("new-2", True, False),
        ]
        for result in (results[0], results[3]):
            assert fields(result.job()) == {**fields(stored(SCOPE, result.job_id)), "created": True}
        assert fields(results[1].job()) == fields(before["old-same"])
        assert results[2].snapshot is None
        assert results[2].conflict is not None
        assert set(results[2].conflict.fields) == {"payload_json", "priority"}
        with pytest.raises(JobIdentityConflict):
            results[2].job()
        assert {job_id: stored(SCOPE, job_id) for job_id in before} == before
        assert Job.objects.count() == 4

    def test_a_new_jobs_snapshot_equals_one_built_field_by_field(self) -> None:
        later = timezone.now() + timedelta(minutes=5)
        subs = [
            JobSubmissionFactory(),
            JobSubmissionFactory(not_before=later, priority=-4, max_attempts=7, version=3),
        ]
        results = submit_jobs([(SCOPE, f"job-{n}", sub) for n, sub in enumerate(subs)])
        for result, sub in zip(results, subs, strict=True):
            snap = result.job()
            # Built by the dataclass from the stored row: equal, field for field.
            expected = JobSnapshot(**{**fields(stored(SCOPE, result.job_id)), "created": True})
            assert snap.next_run_at == (sub.initial_not_before or snap.created_at)
            assert {name: getattr(snap, name) for name in IDENTITY_FIELDS} == {
                name: getattr(sub, name) for name in IDENTITY_FIELDS
            }
            assert snap == expected
            assert hash(snap) == hash(expected)
            assert result == SubmitResult(job_id=result.job_id, snapshot=expected)
            assert hash(result) == hash(SubmitResult(job_id=result.job_id, snapshot=expected))

    def test_a_batch_beyond_one_statements_parameter_limit(self) -> None:
        # SQLite accepts 32,766 parameters per statement: 2,000 rows of 19 need several.
        count = 2_000
        sub = JobSubmissionFactory()
        submit_jobs([(SCOPE, "job-1999", JobSubmissionFactory(payload={"other": 1}))])
        results = submit_jobs([(SCOPE, f"job-{n}", sub) for n in range(count)])
        assert sum(r.created for r in results) == count - 1
        assert results[-1].conflict is not None
        assert results[-1].conflict.fields == ("payload_json",)
        assert Job.objects.count() == count
        again = submit_jobs([(SCOPE, f"job-{n}", sub) for n in range(count - 1)])
        assert not any(r.created or r.conflict for r in again)
        assert Job.objects.count() == count

    def test_bad_item_after_existing_ones_changes_nothing(self, unchanged) -> None:
        submit_jobs([(SCOPE, f"job-{n}", JobSubmissionFactory()) for n in range(3)])
        items: list[Any] = [(SCOPE, f"job-{n}", JobSubmissionFactory()) for n in range(5)]
        items.append((SCOPE, "job-x", JobSubmissionFactory(payload={"n": 1}).payload_json))
        with unchanged(), pytest.raises(InvalidSubmission):
            submit_jobs(items)

    def test_empty_batch(self) -> None:
        assert submit_jobs([]) == []

    @pytest.mark.parametrize(
        ("bad_item", "error"),
        [
            pytest.param(("", "job-x", JobSubmissionFactory()), InvalidScope, id="scope"),
            pytest.param((SCOPE, " x", JobSubmissionFactory()), InvalidJobId, id="job-id"),
            pytest.param((SCOPE, "job-x", {"handler": "x"}), InvalidSubmission, id="submission"),
            pytest.param((SCOPE, "job-x"), InvalidSubmission, id="shape"),
        ],
    )
    def test_bad_input_anywhere_writes_nothing(self, bad_item: Any, error: type) -> None:
        items = [(SCOPE, "job-1", JobSubmissionFactory()), bad_item]
        with pytest.raises(error):
            submit_jobs(items)
        assert Job.objects.count() == 0

    def test_refuses_inside_atomic_and_writes_nothing(self) -> None:
        with transaction.atomic(), pytest.raises(AmbientTransactionError, match="stage_job"):
            submit_jobs([(SCOPE, "job-1", JobSubmissionFactory())])
        with transaction.atomic(), pytest.raises(AmbientTransactionError):
            JobScope(SCOPE).submit_many([("job-1", JobSubmissionFactory())])
        assert Job.objects.count() == 0

    def test_a_winner_that_cannot_be_found_is_a_typed_error(self, monkeypatch) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        monkeypatch.setattr(submission, "_existing_many", lambda keys: {})
        with pytest.raises(JobIdentityUnresolved) as raised:
            submit_jobs([(SCOPE, "job-1", JobSubmissionFactory())])
        assert raised.value.job_ids == ("job-1",)
        assert Job.objects.count() == 1

    def test_one_insert_statement_per_chunk(self) -> None:
        sub = JobSubmissionFactory()
        with CaptureQueriesContext(connection) as queries:
            submit_jobs([(SCOPE, f"job-{n}", sub) for n in range(50)])
        inserts = [q for q in queries.captured_queries if "INTO JOBS_JOB " in q["sql"].upper()]
        assert len(inserts) == 1
        # In a fair queue the scope's 50 places are taken at once, from its lane.
        lanes = [q for q in queries.captured_queries if "INTO JOBS_LANE " in q["sql"].upper()]
        assert len(lanes) == 1


@pytest.mark.django_db
class TestScopedBulkSubmit:
    def test_submit_many_uses_the_scope(self) -> None:
        results = JobScope(SCOPE).submit_many(
            [("job-1", JobSubmissionFactory()), (None, JobSubmissionFactory())]
        )
        assert all(isinstance(r, SubmitResult) and r.created for r in results)
        assert {s.job_id for s in JobScope(SCOPE).list()} == {r.job_id for r in results}
        assert JobScope(OTHER).list() == []

    def test_submit_many_rejects_other_shapes(self) -> None:
        with pytest.raises(InvalidSubmission):
            JobScope(SCOPE).submit_many([(SCOPE, "job-1", JobSubmissionFactory())])  # type: ignore[list-item]
        assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
class TestBulkSubmitCommits:
    def test_commits_on_its_own(self, background) -> None:
        submit_jobs([(SCOPE, f"job-{n}", JobSubmissionFactory()) for n in range(3)])
        assert background(lambda: Job.objects.count()).result(30) == 3

    def test_overlapping_concurrent_batches_create_each_job_once(self, concurrently) -> None:
        def batch(offset: int) -> Callable[[], list[SubmitResult]]:
            ids = [f"job-{n}" for n in range(offset, offset + 40)]
            return lambda: submit_jobs([(SCOPE, i, JobSubmissionFactory()) for i in ids])

        outcomes = concurrently(batch(0), batch(20), batch(10), batch(0))
        assert [o.error for o in outcomes] == [None] * 4
        created: dict[str, int] = {}
        for outcome in outcomes:
            for result in outcome.value:
                assert result.conflict is None
                created[result.job_id] = created.get(result.job_id, 0) + result.created
        assert len(created) == 60
        assert set(created.values()) == {1}
        assert Job.objects.count() == 60

    def test_concurrent_different_requests_have_exactly_one_winner(self, concurrently) -> None:
        def batch(n: int) -> Callable[[], list[SubmitResult]]:
            return lambda: submit_jobs([(SCOPE, "job-1", JobSubmissionFactory(payload={"n": n}))])

        outcomes = concurrently(*[batch(n) for n in range(6)])
        results = [o.value[0] for o in outcomes]
        assert sum(r.created for r in results) == 1
        conflicts = [r.conflict for r in results if r.conflict is not None]
        assert len(conflicts) == 5
        assert all(c.fields == ("payload_json",) for c in conflicts)

    @pytest.mark.postgres_only
    def test_a_batch_is_one_statement_in_autocommit(self, background) -> None:
        submit_job(SCOPE, "job-1", JobSubmissionFactory())
        sub = JobSubmissionFactory()
        with CaptureQueriesContext(connection) as queries:
            results = submit_jobs([(SCOPE, f"job-{n}", sub) for n in range(2, 300)])
        assert all(r.created for r in results)
        assert len(queries.captured_queries) == 1, queries.captured_queries
        assert background(lambda: Job.objects.count()).result(30) == 299

    @pytest.mark.postgres_only
    def test_a_race_lost_to_a_concurrent_insert_falls_back_per_item(
        self, background, blocked_on_lock, monkeypatch
    ) -> None:
        # The batch's one statement checks that its identities are new, then meets a
        # concurrent insert of two of them on the identity index: it waits, fails with
        # a unique violation when that insert commits, and the batch is redone with
        # ON CONFLICT: every item gets the outcome it would have had without the race.
        fallbacks: list[int] = []
        insert_many = submission._insert_many

        def spied(*args: Any) -> Any:
            fallbacks.append(len(args[1]))
            return insert_many(*args)

        monkeypatch.setattr(submission, "_insert_many", spied)
        same, different = JobSubmissionFactory(payload={"a": 1}), JobSubmissionFactory()
        batch = [
            (SCOPE, "job-0", JobSubmissionFactory()),
            (SCOPE, "job-1", same),
            (SCOPE, "job-2", JobSubmissionFactory(payload={"b": 2})),
            (SCOPE, "job-3", JobSubmissionFactory()),
        ]
        with transaction.atomic():
            stage_job(SCOPE, "job-1", same)
            stage_job(SCOPE, "job-2", different)
            racing = background(lambda: submit_jobs(batch))
            # Watched from a connection of its own: this transaction's view of
            # pg_stat_activity would stay as it first read it.
            background(blocked_on_lock).result(30)
        results = racing.result(30)
        assert fallbacks == [4]
        assert [(r.job_id, r.created, r.conflict is not None) for r in results] == [
            ("job-0", True, False),
            ("job-1", False, False),
            ("job-2", False, True),
            ("job-3", True, False),
        ]
        assert results[1].job().payload == {"a": 1}
        assert stored(SCOPE, "job-2").payload_json == different.payload_json
        assert Job.objects.count() == 4

    @pytest.mark.postgres_only
    def test_wakes_workers_once_per_queue_on_commit(self) -> None:
        import psycopg

        from jobs.conf import jobs_settings

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        with psycopg.connect(**params, autocommit=True) as listener:
            listener.execute(f"LISTEN {jobs_settings().NOTIFY_CHANNEL}")
            later = timezone.now() + timedelta(hours=1)
            submit_jobs(
                [(SCOPE, f"a-{n}", JobSubmissionFactory(queue="a")) for n in range(3)]
                + [(SCOPE, "b-1", JobSubmissionFactory(queue="b"))]
                + [(SCOPE, "c-1", JobSubmissionFactory(queue="c", not_before=later))]
            )
            payloads = sorted(n.payload for n in listener.notifies(timeout=1.0, stop_after=10))
        assert payloads == ["a", "b"]


@pytest.mark.django_db(transaction=True)
class TestBatchedCompletionInAutocommit:
    """Outside any transaction, PostgreSQL finishes and claims in one statement that is
    its own transaction: its guards must hold without a transaction around them."""

    def test_a_missing_attempt_row_changes_nothing(self, make_job, unchanged) -> None:
        claims = [make_job.running(f"job-{n}") for n in range(2)]
        make_job.queued("job-queued")
        JobAttempt.objects.filter(token=claims[1].token).delete()
        with unchanged(), pytest.raises(AttemptRowMissing):
            execution.complete_and_claim([(c, None) for c in claims], "w1", limit=4)
        with unchanged(), pytest.raises(AttemptRowMissing):
            execution.complete_many([(c, None) for c in claims])

    @pytest.mark.postgres_only
    def test_finish_and_claim_is_one_statement_in_autocommit(self, make_job) -> None:
        done = make_job.running("job-1")
        make_job.queued("job-2")
        with CaptureQueriesContext(connection) as queries:
            outcomes, claims = execution.complete_and_claim([(done, "r")], "w1", limit=4)
        assert outcomes == {done.token: FinishOutcome.SUCCEEDED}
        assert [c.job_id for c in claims] == ["job-2"]
        assert len(queries.captured_queries) == 1, queries.captured_queries
        assert make_job.row("job-1").status == JobStatus.SUCCEEDED


@pytest.mark.django_db
class TestBatchedCompletion:
    """``complete_many`` / ``complete_and_claim``: each token by the finish rules, one
    commit a batch."""

    def test_completes_each_attempt_with_its_result(self, make_job) -> None:
        claims = [make_job.running(f"job-{n}") for n in range(3)]
        outcomes = execution.complete_many([(c, f"r-{n}") for n, c in enumerate(claims)])
        assert outcomes == {c.token: FinishOutcome.SUCCEEDED for c in claims}
        for n in range(len(claims)):
            job = make_job.row(f"job-{n}")
            assert (job.status, job.result_ref, job.current_token) == ("succeeded", f"r-{n}", None)
            [attempt] = make_job.attempts(f"job-{n}")
            assert (attempt.status, attempt.result_ref) == ("succeeded", f"r-{n}")
            assert attempt.finished_at == job.finished_at

    def test_a_committed_cancel_request_wins_and_drops_the_result(self, make_job, scope) -> None:
        claim = make_job.running("job-1")
        other = make_job.running("job-2")
        assert scope.cancel("job-1") is CancelOutcome.REQUESTED
        outcomes = execution.complete_many([(claim, "r"), (other, None)])
        assert outcomes == {
            claim.token: FinishOutcome.CANCELLED,
            other.token: FinishOutcome.SUCCEEDED,
        }
        job = make_job.row("job-1")
        assert (job.status, job.result_ref) == ("cancelled", None)
        assert [(a.status, a.result_ref) for a in make_job.attempts("job-1")] == [
            ("cancelled", None)
        ]

    def test_a_stale_token_changes_nothing_and_says_so(self, make_job) -> None:
        claim = make_job.running("job-1", max_attempts=2)
        assert execution.recover(claim.token) is FinishOutcome.REQUEUED
        fresh = make_job.running("job-2")
        before = [a.status for a in make_job.attempts("job-1")]
        outcomes = execution.complete_many([(claim, "late"), (fresh, None)])
        assert outcomes == {claim.token: FinishOutcome.STALE, fresh.token: FinishOutcome.SUCCEEDED}
        assert make_job.row("job-1").status == "queued"
        assert [a.status for a in make_job.attempts("job-1")] == before

    def test_a_missing_attempt_row_fails_the_whole_batch(self, make_job, unchanged) -> None:
        claims = [make_job.running(f"job-{n}") for n in range(2)]
        JobAttempt.objects.filter(token=claims[1].token).delete()
        with unchanged(), pytest.raises(AttemptRowMissing):
            execution.complete_many([(c, None) for c in claims])
        with unchanged(), pytest.raises(AttemptRowMissing):
            execution.complete_and_claim([(c, None) for c in claims], "w1", limit=4)

    def test_a_stale_token_without_an_attempt_row_does_not_fail_the_batch(self, make_job) -> None:
        # Only a job Running under the token needs its attempt row; a stale token is
        # STALE whatever became of its attempt.
        old = make_job.running("job-1", max_attempts=2)
        assert execution.recover(old.token) is FinishOutcome.REQUEUED
        JobAttempt.objects.filter(token=old.token).delete()
        fresh = make_job.running("job-2")
        outcomes = execution.complete_many([(old, "late"), (fresh, "r")])
        assert outcomes == {old.token: FinishOutcome.STALE, fresh.token: FinishOutcome.SUCCEEDED}
        assert make_job.row("job-1").status == JobStatus.QUEUED

    def test_a_token_given_twice_is_finished_once_with_its_first_result(self, make_job) -> None:
        claim = make_job.running("job-1")
        outcomes = execution.complete_many([(claim, "first"), (claim, "second")])
        assert outcomes == {claim.token: FinishOutcome.SUCCEEDED}
        assert make_job.row("job-1").result_ref == "first"
        assert [(a.status, a.result_ref) for a in make_job.attempts("job-1")] == [
            ("succeeded", "first")
        ]

    def test_a_missing_attempt_row_late_in_a_long_batch_changes_nothing(
        self, make_job, scope, unchanged, monkeypatch
    ) -> None:
        # SQLite finishes a long batch in chunks, in one transaction: the last chunk's
        # missing attempt row undoes the chunks before it.
        monkeypatch.setattr(finishing, "CHUNK_ROWS", 2)
        claims = [make_job.running(f"job-{n}") for n in range(5)]
        make_job.queued("job-queued")
        assert scope.cancel("job-0") is CancelOutcome.REQUESTED
        JobAttempt.objects.filter(token=claims[4].token).delete()
        with unchanged(), pytest.raises(AttemptRowMissing):
            execution.complete_many([(c, f"r-{n}") for n, c in enumerate(claims)])
        with unchanged(), pytest.raises(AttemptRowMissing):
            execution.complete_and_claim([(c, None) for c in claims], "w1", limit=2)

    def test_two_attempts_of_one_job_in_one_batch(self, make_job) -> None:
        old = make_job.running("job-1", max_attempts=2)
        assert execution.recover(old.token) is FinishOutcome.REQUEUED
        new = execution.try_start(old.scope_hash, "job-1", "w1")
        assert new is not None
        outcomes = execution.complete_many([(old, "old"), (new, "new")])
        assert outcomes == {old.token: FinishOutcome.STALE, new.token: FinishOutcome.SUCCEEDED}
        assert make_job.row("job-1").result_ref == "new"

    def test_complete_and_claim_shares_one_transaction(self, make_job) -> None:
        done = make_job.running("job-1")
        make_job.queued("job-2")
        make_job.queued("job-3")
        with CaptureQueriesContext(connection) as queries:
            outcomes, claims = execution.complete_and_claim([(done, "r")], "w2", limit=1)
        assert outcomes == {done.token: FinishOutcome.SUCCEEDED}
        assert [c.job_id for c in claims] == ["job-2"]
        assert make_job.row("job-2").status == "running"
        assert [a.status for a in make_job.attempts("job-2")] == ["running"]
        assert make_job.attempts("job-2")[0].token == claims[0].token
        assert make_job.row("job-3").status == "queued"
        commits = [q for q in queries.captured_queries if q["sql"].upper().startswith("COMMIT")]
        assert len(commits) <= 1

    def test_nothing_to_do(self) -> None:
        assert execution.complete_and_claim([], "w1", limit=0) == ({}, [])

    def test_bad_result_reference_is_rejected_before_anything_changes(
        self, make_job, unchanged
    ) -> None:
        claim = make_job.running("job-1")
        with unchanged(), pytest.raises(InvalidInput):
            execution.complete_many([(claim, "x\x00")])


@pytest.mark.django_db(transaction=True)
def test_a_bulk_insert_on_sqlite_binds_positional_parameters() -> None:
    """SQLite looks each named parameter up among those before it in the statement (a
    parse that grows with the square of their number: half a second for 500 jobs);
    the store's statements reach it with positional ones, in the same order."""
    if connection.vendor != "sqlite":
        pytest.skip("about SQLite's parameter binding")
    seen: list[Any] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("INSERT INTO jobs_job"):
            seen.append(params)
        return execute(sql, params, many, context)

    items = [(SCOPE, f"bulk-{n}", JobSubmissionFactory(payload={"n": n})) for n in range(3)]
    with connection.execute_wrapper(record):
        submit_jobs(items)
    (params,) = seen
    assert isinstance(params, list)
    payloads = [p for p in params if isinstance(p, str) and p.startswith('{"n":')]
    assert payloads == ['{"n":0}', '{"n":1}', '{"n":2}']
    assert [j.payload for j in JobScope(SCOPE).list()] == [{"n": 0}, {"n": 1}, {"n": 2}]
