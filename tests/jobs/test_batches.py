"""Batches: jobs submitted together, counted as each ends, and one ``then`` job
submitted in the transaction that ends the last of them — exactly once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs import (
    JobScope,
    JobStatus,
    JobSubmission,
    execution,
    stage_batch,
    store,
    submit_batch,
    submit_job,
)
from jobs.exceptions import (
    AmbientTransactionError,
    BatchIdentityConflict,
    InvalidJobId,
    InvalidSubmission,
    TransactionRequiredError,
    UnknownHandler,
)
from jobs.models import Batch, Job
from jobs.store import scoped, sql_endings, sql_submit
from jobs.types import CancelOutcome, Claim

SCOPE = "tenant-batches"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def row(n: int, **kwargs: Any) -> tuple[str, JobSubmission]:
    return (f"row-{n}", JobSubmission.create("imports.row", {"n": n}, **kwargs))


THEN = JobSubmission.create("imports.done", {"import": 9})


@pytest.fixture(autouse=True)
def _handlers(handler: Callable[..., Any]) -> None:
    """The batch's handlers, registered: a ``then`` must name a known one."""
    handler("imports.row")(lambda ctx: None)
    handler("imports.done")(lambda ctx: None)


def claim_all(limit: int = 100) -> list[Claim]:
    return execution.claim_due("w1", limit=limit)


def then_jobs() -> list[Job]:
    return list(Job.objects.filter(job_id__endswith=":then"))


@pytest.mark.django_db(transaction=True)
class TestSubmit:
    def test_a_batch_and_its_jobs(self) -> None:
        batch = submit_batch(SCOPE, "import-9", [row(1), row(2)], then=THEN)
        assert batch.created
        assert (batch.total, batch.pending, batch.status) == (2, 2, "open")
        assert batch.then_job_id == "import-9:then"
        jobs = JobScope(SCOPE).list()
        assert [(j.job_id, j.batch_id) for j in jobs] == [
            ("row-1", "import-9"),
            ("row-2", "import-9"),
        ]
        assert JobScope(SCOPE).batch("import-9") == batch.__class__(
            **{**_fields(batch), "created": False}
        )
        # Nothing of the then yet.
        assert not then_jobs()

    def test_the_same_batch_again_returns_it(self) -> None:
        first = submit_batch(SCOPE, "b", [row(1), row(2)], then=THEN)
        again = submit_batch(SCOPE, "b", [row(2), row(1)], then=THEN)
        assert (first.created, again.created) == (True, False)
        assert Job.objects.count() == 2
        assert Batch.objects.count() == 1

    @pytest.mark.parametrize(
        ("jobs", "then"),
        [
            ([row(1)], THEN),
            ([row(1), row(3)], THEN),
            ([row(1), row(2, max_attempts=2)], THEN),
            ([row(1), row(2)], None),
            ([row(1), row(2)], JobSubmission.create("imports.done", {"import": 10})),
        ],
    )
    def test_other_jobs_under_the_same_id_conflict(
        self, jobs: list[tuple[str, JobSubmission]], then: JobSubmission | None
    ) -> None:
        submit_batch(SCOPE, "b", [row(1), row(2)], then=THEN)
        with pytest.raises(BatchIdentityConflict):
            submit_batch(SCOPE, "b", jobs, then=then)
        assert Job.objects.count() == 2

    def test_a_job_id_taken_outside_the_batch_conflicts_and_writes_nothing(self) -> None:
        submit_job(SCOPE, "row-2", row(2)[1])
        with pytest.raises(BatchIdentityConflict, match="row-2"):
            submit_batch(SCOPE, "b", [row(1), row(2)])
        assert not Batch.objects.exists()
        assert list(Job.objects.values_list("job_id", flat=True)) == ["row-2"]

    @pytest.mark.parametrize(
        ("jobs", "then", "error"),
        [
            ([], None, InvalidSubmission),
            ([row(1), row(1)], None, InvalidSubmission),
            ([("", row(1)[1])], None, InvalidJobId),
            ([(None, row(1)[1])], None, InvalidJobId),
            ([("x", {"not": "a submission"})], None, InvalidSubmission),
            ("row", None, InvalidSubmission),
            ([("x",)], None, InvalidSubmission),
            ([row(1, unique_key="u")], None, InvalidSubmission),
            ([row(1)], JobSubmission.create("imports.done", start_within=10), InvalidSubmission),
            ([row(1)], "imports.done", InvalidSubmission),
        ],
    )
    def test_bad_input_is_a_typed_error_that_writes_nothing(
        self, jobs: Any, then: Any, error: type[Exception]
    ) -> None:
        with pytest.raises(error):
            submit_batch(SCOPE, "b", jobs, then=then)
        assert not Batch.objects.exists()
        assert not Job.objects.exists()

    def test_a_batch_id_leaves_room_for_its_then(self) -> None:
        with pytest.raises(InvalidJobId):
            submit_batch(SCOPE, "b" * 196, [row(1)])
        assert (
            submit_batch(SCOPE, "b" * 195, [row(1)], then=THEN).then_job_id == "b" * 195 + ":then"
        )

    def test_a_then_whose_handler_this_process_does_not_register(self, monkeypatch: Any) -> None:
        from jobs import handlers

        # A handler the registry does not know is one it cannot tell from a module not
        # imported, until the process discovered its handlers (as a worker does).
        monkeypatch.setattr(handlers, "_discovered", False)
        assert submit_batch(SCOPE, "a", [row(0)], then=JobSubmission.create("imports.gone")).created
        monkeypatch.setattr(handlers, "_discovered", True)
        for unknown in (
            JobSubmission.create("imports.gone"),
            JobSubmission.create("imports.done", version=2),
        ):
            with pytest.raises(UnknownHandler):
                submit_batch(SCOPE, "b", [row(1)], then=unknown)
        assert not Batch.objects.filter(batch_id="b").exists()
        assert submit_batch(SCOPE, "b", [row(1)], then=THEN).created

    def test_submit_refuses_a_transaction_and_stage_needs_one(self) -> None:
        with transaction.atomic(), pytest.raises(AmbientTransactionError):
            submit_batch(SCOPE, "b", [row(1)])
        with pytest.raises(TransactionRequiredError):
            stage_batch(SCOPE, "b", [row(1)])
        assert not Batch.objects.exists()

    def test_a_staged_batch_exists_only_if_its_transaction_commits(self) -> None:
        def failing_work() -> None:
            with transaction.atomic():
                stage_batch(SCOPE, "b", [row(1), row(2)], then=THEN)
                raise RuntimeError("the business work failed")

        with pytest.raises(RuntimeError):
            failing_work()
        assert not Batch.objects.exists()
        assert not Job.objects.exists()
        with transaction.atomic():
            assert stage_batch(SCOPE, "b", [row(1), row(2)], then=THEN).created
        assert Job.objects.count() == 2

    def test_a_staged_conflict_rolls_the_transaction_back(self) -> None:
        submit_batch(SCOPE, "b", [row(1)])
        with transaction.atomic():
            submit_job_in_tx = stage_batch(SCOPE, "other", [row(5)])
            assert submit_job_in_tx.created
            with pytest.raises(BatchIdentityConflict):
                stage_batch(SCOPE, "b", [row(2)])
        assert not Batch.objects.filter(batch_id="other").exists()


def test_a_then_job_is_inserted_as_every_new_job() -> None:
    assert tuple(sql_endings.THEN_VALUES) == sql_submit.NEW_JOB_COLUMNS


def _fields(batch: Any) -> dict[str, Any]:
    return {name: getattr(batch, name) for name in batch.__dataclass_fields__}


@pytest.mark.django_db(transaction=True)
class TestFanIn:
    def test_then_is_submitted_when_the_last_job_ends_and_not_before(self) -> None:
        submit_batch(SCOPE, "imp", [row(1), row(2), row(3)], then=THEN)
        claims = {c.job_id: c for c in claim_all()}
        execution.complete(claims["row-1"].token)
        execution.fail(claims["row-2"].token, "bad row")
        assert not then_jobs()
        batch = JobScope(SCOPE).batch("imp")
        assert batch is not None
        assert (batch.succeeded, batch.failed, batch.pending, batch.status) == (1, 1, 1, "open")
        execution.complete(claims["row-3"].token)
        (then,) = then_jobs()
        assert (then.job_id, then.handler, then.payload_json) == (
            "imp:then",
            "imports.done",
            '{"import":9}',
        )
        assert then.status == JobStatus.QUEUED
        assert then.batch_id is None
        done = JobScope(SCOPE).batch("imp")
        assert done is not None
        assert (done.succeeded, done.failed, done.pending, done.status) == (2, 1, 0, "done")
        assert done.finished_at is not None

    def test_a_then_staged_into_another_scope_is_inserted_there_as_named(self) -> None:
        # Trusted code (the workflows' maps) names the scope and id of the job that
        # follows a batch: the statement that ends its last job inserts that one.
        scope_hash, elsewhere = JobScope(SCOPE).scope_hash, JobScope("elsewhere").scope_hash
        with transaction.atomic():
            staged = store.stage_batch(
                scope_hash, "imp", [row(1), row(2)], THEN, then_as=(elsewhere, "next-step")
            )
        assert staged.then_job_id is None  # no job of the batch's scope follows it
        claims = claim_all()
        for claim in claims[:-1]:
            execution.complete(claim.token)
        assert not Job.objects.filter(job_id="next-step").exists()
        execution.complete(claims[-1].token)
        assert not then_jobs()
        then = Job.objects.get(job_id="next-step")
        assert (then.scope_hash, then.handler, then.payload_json, then.status) == (
            elsewhere,
            "imports.done",
            '{"import":9}',
            JobStatus.QUEUED,
        )
        # The same batch with its then elsewhere is another batch.
        with pytest.raises(BatchIdentityConflict), transaction.atomic():
            store.stage_batch(scope_hash, "imp", [row(1), row(2)], THEN)

    def test_then_keeps_its_submission_cost_and_priority_included(self) -> None:
        then = JobSubmission.create("imports.done", {}, cost=7, priority=3, max_attempts=2)
        submit_batch(SCOPE, "imp", [row(1)], then=then)
        (claim,) = claim_all()
        execution.complete(claim.token)
        (job,) = then_jobs()
        assert (job.cost, job.priority, job.max_attempts) == (7, 3, 2)
        # Its cost is part of the batch: the same id with a then of another cost conflicts.
        other = JobSubmission.create("imports.done", {}, priority=3, max_attempts=2)
        with pytest.raises(BatchIdentityConflict):
            submit_batch(SCOPE, "imp", [row(1)], then=other)

    def test_cancelled_expired_and_interrupted_jobs_count_as_finished(self) -> None:
        scope_hash = JobScope(SCOPE).scope_hash
        store.submit_batch(
            scope_hash,
            "imp",
            [row(1), row(2, start_by=T0 + timedelta(seconds=5)), row(3), row(4)],
            THEN,
            now=T0,
        )
        assert JobScope(SCOPE).cancel("row-1") is CancelOutcome.CANCELLED
        assert execution.expire_jobs(now=T0 + timedelta(seconds=5)) == 1
        claims = {c.job_id: c for c in execution.claim_due("w1", limit=5, now=T0)}
        assert set(claims) == {"row-3", "row-4"}
        execution.interrupt(claims["row-3"].token, now=T0)
        assert not then_jobs()
        execution.complete(claims["row-4"].token, now=T0)
        assert len(then_jobs()) == 1
        batch = JobScope(SCOPE).batch("imp")
        assert batch is not None
        assert (batch.succeeded, batch.failed, batch.cancelled, batch.expired, batch.pending) == (
            1,
            1,
            1,
            1,
            0,
        )

    def test_a_retried_failure_is_pending_again_and_then_runs_once(self) -> None:
        submit_batch(SCOPE, "imp", [row(1, max_attempts=2)], then=THEN)
        (claim,) = claim_all()
        # An automatic retry: the job is not final, the batch stays open.
        assert execution.fail(claim.token, "x", retry_at=datetime.now(UTC)).value == "requeued"
        batch = JobScope(SCOPE).batch("imp")
        assert batch is not None
        assert (batch.failed, batch.pending) == (0, 1)
        assert not then_jobs()
        (claim,) = claim_all()
        execution.fail(claim.token, "y", retry_at=datetime.now(UTC))  # no attempt left
        assert len(then_jobs()) == 1
        # An operator's retry takes it back to pending; its end does not submit then again.
        JobScope(SCOPE).retry("row-1", extra_attempts=1)
        batch = JobScope(SCOPE).batch("imp")
        assert batch is not None
        assert (batch.failed, batch.pending, batch.status) == (0, 1, "open")
        (claim,) = [c for c in claim_all() if c.job_id == "row-1"]
        execution.complete(claim.token)
        assert len(then_jobs()) == 1
        batch = JobScope(SCOPE).batch("imp")
        assert batch is not None
        assert (batch.succeeded, batch.pending) == (1, 0)

    def test_a_cancel_and_a_retry_by_filter_count_every_job(self) -> None:
        submit_batch(SCOPE, "imp", [row(n) for n in range(3)], then=THEN)
        ids = list(Job.objects.filter(batch_id="imp").order_by("id").values_list("pk", flat=True))
        assert scoped.cancel_many(ids).changed[scoped.CANCELLED] == 3
        batch = JobScope(SCOPE).batch("imp")
        assert batch is not None
        assert (batch.cancelled, batch.pending, batch.status) == (3, 0, "done")
        assert len(then_jobs()) == 1
        # Pending again; their ends do not submit then again.
        assert scoped.retry_many(ids).changed == {scoped.REQUEUED: 3}
        batch = JobScope(SCOPE).batch("imp")
        assert batch is not None
        assert (batch.cancelled, batch.pending, batch.status) == (0, 3, "open")
        execution.complete_many([(claim, None) for claim in claim_all()])
        batch = JobScope(SCOPE).batch("imp")
        assert batch is not None
        assert (batch.succeeded, batch.pending, batch.status) == (3, 0, "done")
        assert len(then_jobs()) == 1

    def test_complete_many_and_the_finish_and_claim_count_every_job(self) -> None:
        submit_batch(SCOPE, "imp", [row(n) for n in range(6)], then=THEN)
        claims = claim_all(limit=3)
        execution.complete_many([(c, None) for c in claims])
        batch = JobScope(SCOPE).batch("imp")
        assert batch is not None
        assert batch.pending == 3
        rest = claim_all(limit=2)
        outcomes, more = execution.complete_and_claim([(c, None) for c in rest], "w1", limit=5)
        assert len(outcomes) == 2
        assert [c.job_id for c in more] == ["row-5"]
        assert not then_jobs()
        outcomes, after = execution.complete_and_claim([(more[0], "r")], "w1", limit=5)
        # The then job, submitted by that very statement, is claimed by the next one.
        assert [c.job_id for c in after] == [] or [c.job_id for c in after] == ["imp:then"]
        assert len(then_jobs()) == 1

    def test_a_put_back_that_gives_up_counts(self, settings: Any) -> None:
        settings.JOBS = {**settings.JOBS, "UNKNOWN_HANDLER_RETRY_SECONDS": 0}
        submit_batch(SCOPE, "imp", [row(1)], then=THEN)
        (claim,) = claim_all()
        assert execution.put_back_unknown_handler(claim.token, "unknown").value == "failed"
        assert len(then_jobs()) == 1

    def test_the_fan_in_costs_no_statement_on_postgresql(self, pg_only: None) -> None:
        """The count and the then are part of the job's own finishing statement."""
        submit_batch(SCOPE, "imp", [row(1), row(2)], then=THEN)
        claims = claim_all()
        for claim in claims:
            with CaptureQueriesContext(connection) as queries:
                execution.complete_many([(claim, None)])
            assert len(queries) == 1, [q["sql"][:80] for q in queries]
        assert len(then_jobs()) == 1


@pytest.mark.django_db(transaction=True)
class TestRaces:
    def test_then_runs_once_however_the_last_finishes_race(
        self, concurrently: Callable[..., Any]
    ) -> None:
        for attempt in range(3):
            batch_id = f"race-{attempt}"
            submit_batch(SCOPE, batch_id, [row(n) for n in range(4)], then=THEN)
            claims = [c for c in claim_all() if not c.job_id.endswith(":then")]
            assert len(claims) == 4
            outcomes = concurrently(
                *[lambda c=c: execution.complete_many([(c, None)]) for c in claims]
            )
            assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
            assert Job.objects.filter(job_id=f"{batch_id}:then").count() == 1
            batch = JobScope(SCOPE).batch(batch_id)
            assert batch is not None
            assert (batch.succeeded, batch.pending) == (4, 0)
            # Start the next round with nothing left over.
            Job.objects.all().delete()
