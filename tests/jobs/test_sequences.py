"""Sequences: a scope's jobs with one ``sequence_key`` start one at a time, in
submission order; a later one stays Queued (held) until every earlier one is final."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobs import JobScope, JobStatus, JobSubmission, execution, store, submit_job
from jobs.api import submit_jobs
from jobs.exceptions import InvalidSubmission
from jobs.models import Job, Sequence
from jobs.store import scoped
from jobs.types import CancelOutcome, Claim

SCOPE = "tenant-sequences"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def sub(n: int, key: str | None = "acct-42", handler: str = "ledger.post", **kwargs: Any):
    return JobSubmission.create(handler, {"n": n}, sequence_key=key, **kwargs)


def claimable() -> list[str]:
    """The job ids a claim may take now, in claim order (nothing claimed)."""
    return [d.job_id for d in execution.get_due(limit=100)]


def claim(job_id: str) -> Claim:
    claims = execution.claim_due("w1", limit=100)
    mine = [c for c in claims if c.job_id == job_id]
    for other in claims:
        if other.job_id != job_id:
            execution.release(other.token)
    assert mine, f"{job_id} was not claimable: {[c.job_id for c in claims]}"
    return mine[0]


def held() -> list[str]:
    return list(
        Job.objects.filter(sequence_held=True, status="queued")
        .order_by("id")
        .values_list("job_id", flat=True)
    )


def pks(*job_ids: str) -> list[int]:
    """The primary keys of ``job_ids`` (of :data:`SCOPE`), as a bulk operation takes them."""
    rows = Job.objects.filter(scope_hash=JobScope(SCOPE).scope_hash, job_id__in=job_ids)
    return list(rows.order_by("id").values_list("pk", flat=True))


def sequence_row(key: str = "acct-42") -> Sequence:
    return Sequence.objects.get(scope_hash=JobScope(SCOPE).scope_hash, sequence_key=key)


@pytest.mark.django_db(transaction=True)
class TestOrder:
    def test_one_at_a_time_in_submission_order(self) -> None:
        for n in range(3):
            submit_job(SCOPE, f"p{n}", sub(n))
        submit_job(SCOPE, "other", sub(9, key=None))
        assert sorted(claimable()) == ["other", "p0"]
        assert held() == ["p1", "p2"]
        first = claim("p0")
        assert sorted(claimable()) == ["other"]
        execution.complete(first.token)
        assert sorted(claimable()) == ["other", "p1"]
        execution.complete(claim("p1").token)
        execution.complete(claim("p2").token)
        assert held() == []
        assert sequence_row().open == 0
        # A new job of a drained sequence starts at once.
        submit_job(SCOPE, "p3", sub(3))
        assert "p3" in claimable()

    def test_across_handlers_and_queues(self) -> None:
        submit_job(SCOPE, "a", sub(0, handler="crm.push", queue="crm"))
        submit_job(SCOPE, "b", sub(1, handler="ledger.post"))
        assert claimable() == ["a"]
        execution.complete(claim("a").token)
        assert claimable() == ["b"]

    def test_other_keys_and_scopes_are_never_held(self) -> None:
        submit_job(SCOPE, "x1", sub(1, key="x"))
        submit_job(SCOPE, "x2", sub(2, key="x"))
        submit_job(SCOPE, "y1", sub(1, key="y"))
        submit_job("another-tenant", "x1", sub(1, key="x"))
        assert sorted(claimable()) == ["x1", "x1", "y1"]

    @pytest.mark.parametrize("ending", ["fail", "cancel", "interrupt", "expire"])
    def test_any_final_state_lets_the_next_start(self, ending: str) -> None:
        scope_hash = JobScope(SCOPE).scope_hash
        store.submit(scope_hash, "p0", sub(0, start_by=T0 + timedelta(seconds=5)), now=T0)
        store.submit(scope_hash, "p1", sub(1), now=T0)
        if ending == "cancel":
            assert JobScope(SCOPE).cancel("p0") is CancelOutcome.CANCELLED
        elif ending == "expire":
            assert execution.expire_jobs(now=T0 + timedelta(seconds=5)) == 1
        else:
            (first,) = execution.claim_due("w1", limit=5, now=T0)
            assert first.job_id == "p0"
            if ending == "fail":
                execution.fail(first.token, "boom", now=T0)
            else:
                execution.interrupt(first.token, now=T0)
        assert held() == []
        assert [c.job_id for c in execution.claim_due("w1", limit=5, now=T0)] == ["p1"]

    def test_a_cancelled_held_job_is_skipped(self) -> None:
        for n in range(3):
            submit_job(SCOPE, f"p{n}", sub(n))
        assert JobScope(SCOPE).cancel("p1") is CancelOutcome.CANCELLED
        assert held() == ["p2"]
        execution.complete(claim("p0").token)
        assert claimable() == ["p2"]

    def test_an_automatic_retry_keeps_its_place(self) -> None:
        submit_job(SCOPE, "p0", sub(0, max_attempts=2))
        submit_job(SCOPE, "p1", sub(1))
        first = claim("p0")
        assert execution.fail(first.token, "again", retry_at=datetime.now(UTC)).value == "requeued"
        assert claimable() == ["p0"]
        assert held() == ["p1"]
        execution.complete(claim("p0").token)
        assert claimable() == ["p1"]

    def test_the_finish_and_claim_releases_and_claims_the_next(self) -> None:
        submit_job(SCOPE, "p0", sub(0))
        submit_job(SCOPE, "p1", sub(1))
        (first,) = execution.claim_due("w1", limit=5)
        assert first.sequence_key == "acct-42"
        outcomes, claims = execution.complete_and_claim([(first, None)], "w1", limit=5)
        assert outcomes[first.token].value == "succeeded"
        # The next is released in the same transaction; the claim of that statement may
        # not see it yet, the next claim does.
        if not claims:
            claims = execution.claim_due("w1", limit=5)
        assert [c.job_id for c in claims] == ["p1"]

    def test_a_cancel_by_filter_lets_the_next_start(self) -> None:
        for n in range(3):
            submit_job(SCOPE, f"p{n}", sub(n))
        outcome = scoped.cancel_many(pks("p0", "p1"))
        assert outcome.changed[scoped.CANCELLED] == 2
        assert held() == []
        assert claimable() == ["p2"]
        assert sequence_row().open == 1

    def test_submit_jobs_admits_each_sequence_in_order(self) -> None:
        results = submit_jobs([(SCOPE, f"p{n}", sub(n)) for n in range(4)])
        assert all(r.created for r in results)
        assert claimable() == ["p0"]
        assert held() == ["p1", "p2", "p3"]
        assert sequence_row().open == 4

    def test_a_repeated_submission_counts_once(self) -> None:
        submit_job(SCOPE, "p0", sub(0))
        again = submit_job(SCOPE, "p0", sub(0))
        assert not again.created
        assert sequence_row().open == 1
        execution.complete(claim("p0").token)
        assert sequence_row().open == 0

    @pytest.mark.parametrize("key", ["", " x", "x" * 201, 42, "a\x00b"])
    def test_a_bad_sequence_key_is_a_typed_error(self, key: object) -> None:
        with pytest.raises(InvalidSubmission):
            JobSubmission.create("ledger.post", sequence_key=key)  # type: ignore[arg-type]
        assert not Job.objects.exists()
        assert not Sequence.objects.exists()


@pytest.mark.django_db(transaction=True)
class TestHalting:
    @pytest.fixture(autouse=True)
    def _halting(self, handler: Callable[..., Any]) -> None:
        handler("ledger.post", sequence_halts_on_failure=True)(lambda ctx: None)

    def fail_first(self) -> None:
        for n in range(3):
            submit_job(SCOPE, f"p{n}", sub(n))
        execution.fail(claim("p0").token, "the ledger refused it")

    def test_a_failure_halts_the_sequence(self) -> None:
        self.fail_first()
        assert claimable() == []
        assert held() == ["p1", "p2"]
        row = sequence_row()
        assert (row.halted_by, row.open) == ("p0", 2)
        # A new job waits too.
        submit_job(SCOPE, "p3", sub(3))
        assert claimable() == []

    def test_a_retry_resumes_it_with_the_failed_job_first(self) -> None:
        self.fail_first()
        JobScope(SCOPE).retry("p0", extra_attempts=1)
        assert sequence_row().halted_by is None
        assert claimable() == ["p0"]
        execution.complete(claim("p0").token)
        assert claimable() == ["p1"]

    def test_a_cancel_of_the_failed_job_lets_the_sequence_go_on(self) -> None:
        self.fail_first()
        assert JobScope(SCOPE).cancel("p0") is CancelOutcome.CANCELLED
        cancelled = JobScope(SCOPE).get("p0")
        assert cancelled is not None
        assert cancelled.status == JobStatus.CANCELLED
        assert sequence_row().halted_by is None
        assert claimable() == ["p1"]
        # A cancel of a failed job that halts nothing is refused as before.
        execution.fail(claim("p1").token, "x")
        submit_job(SCOPE, "q0", sub(0, key="other", handler="crm.push"))
        execution.fail(claim("q0").token, "x")
        assert JobScope(SCOPE).cancel("q0") is CancelOutcome.ALREADY_FINISHED

    def test_a_retry_by_filter_resumes_it_with_the_failed_job_first(self) -> None:
        self.fail_first()
        outcome = scoped.retry_many(pks("p0"), extra_attempts=1)
        assert outcome.changed == {scoped.REQUEUED: 1}
        assert sequence_row().halted_by is None
        assert claimable() == ["p0"]
        assert held() == ["p1", "p2"]
        execution.complete(claim("p0").token)
        assert claimable() == ["p1"]

    def test_a_retry_by_filter_of_several_keeps_their_order(self) -> None:
        submit_job(SCOPE, "c0", sub(0, handler="crm.push"))
        submit_job(SCOPE, "c1", sub(1, handler="crm.push"))
        execution.fail(claim("c0").token, "x")
        execution.fail(claim("c1").token, "x")
        assert sequence_row().open == 0
        outcome = scoped.retry_many(pks("c0", "c1"), extra_attempts=1)
        assert outcome.changed == {scoped.REQUEUED: 2}
        assert claimable() == ["c0"]
        assert held() == ["c1"]
        assert sequence_row().open == 2
        execution.complete(claim("c0").token)
        assert claimable() == ["c1"]

    def test_a_handler_that_does_not_halt_lets_the_next_start(
        self, handler: Callable[..., Any]
    ) -> None:
        submit_job(SCOPE, "c0", sub(0, handler="crm.push"))
        submit_job(SCOPE, "c1", sub(1, handler="crm.push"))
        execution.fail(claim("c0").token, "x")
        assert claimable() == ["c1"]


@pytest.mark.django_db(transaction=True)
class TestRaces:
    def test_racing_submits_hold_all_but_one(self, concurrently: Callable[..., Any]) -> None:
        outcomes = concurrently(*[lambda n=n: submit_job(SCOPE, f"p{n}", sub(n)) for n in range(6)])
        assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
        assert len(claimable()) == 1
        assert len(held()) == 5
        assert sequence_row().open == 6

    def test_a_submit_racing_the_last_finish_is_never_stranded(
        self, concurrently: Callable[..., Any]
    ) -> None:
        for round_ in range(5):
            key = f"k{round_}"
            submit_job(SCOPE, f"{key}-0", sub(0, key=key))
            (first,) = [c for c in execution.claim_due("w1", limit=5) if c.job_id == f"{key}-0"]
            outcomes = concurrently(
                lambda first=first: execution.complete_many([(first, None)]),
                lambda key=key: submit_job(SCOPE, f"{key}-1", sub(1, key=key)),
            )
            assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
            assert f"{key}-1" in claimable(), (round_, held())


@pytest.mark.django_db(transaction=True)
def test_the_worker_finishes_a_sequence_job_and_releases_the_next_in_one_round_trip(
    pg_only: None,
) -> None:
    """PostgreSQL: BEGIN, the finish-and-claim, the release, COMMIT, pipelined: one
    entry in Django's log besides the transaction's own BEGIN and COMMIT, which Django
    logs though they travel in the pipeline (the COMMIT at the block's end finds the
    transaction committed and sends nothing)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for n in range(2):
        submit_job(SCOPE, f"p{n}", sub(n))
    (first,) = execution.claim_due("w1", limit=5)
    with CaptureQueriesContext(connection) as queries:
        execution.complete_and_claim([(first, None)], "w1", limit=5)
    sent = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sent) == 1, [text[:60] for text in sent]
    assert "jobs_sequence" in sent[0]
    assert claimable() == ["p1"]


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_waited_for_the_write_lock_is_timed_when_it_held_it(
    background: Callable[[Callable[[], Any]], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite: a claim whose BEGIN IMMEDIATE waited behind the finish that released
    its job records the start at the time it held the lock — never before that
    finish, so a sequence's attempts read in the order they ran."""
    import threading

    from django.db import connection, transaction

    from ledon import clock

    if connection.vendor != "sqlite":
        pytest.skip("about SQLite's write lock")
    for n in range(2):
        submit_job(SCOPE, f"p{n}", sub(n))
    first = claim("p0")
    base = clock.now() + timedelta(minutes=1)
    shown = {"time": base}
    claim_read_the_clock = threading.Event()
    main = threading.current_thread()

    def fake_now() -> datetime:
        if threading.current_thread() is not main:
            claim_read_the_clock.set()
        return shown["time"]

    monkeypatch.setattr(clock, "now", fake_now)
    finished_at = base + timedelta(seconds=5)
    with transaction.atomic():
        execution.complete_many([(first, None)], now=finished_at)
        later = background(lambda: execution.complete_and_claim([], "w2", limit=5))
        assert claim_read_the_clock.wait(30)
        shown["time"] = finished_at
    _, claims = later.result(timeout=60)
    assert [c.job_id for c in claims] == ["p1"]
    assert claims[0].started_at >= finished_at
    assert Job.objects.get(job_id="p0").finished_at == finished_at
