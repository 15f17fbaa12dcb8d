"""``manage.py bulk_jobs cancel|retry`` and what it stands on (:mod:`jobs.bulk`, the
store's ``cancel_many``/``retry_many``, :mod:`ledon.bulk`): every job a filter
matches and only those change, by the rules of one job's cancel and retry; a dry run
changes nothing; bad input is refused before anything is written; a job that moves on
while a run goes (a worker claims it) ends as the rules say; on PostgreSQL a batch
never waits for a row another transaction holds."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import JobScope, JobSubmission, execution, submit_job
from jobs import bulk as jobs_bulk
from jobs.exceptions import InvalidInput, InvalidSubmission, InvalidTransition
from jobs.models import Job
from jobs.signals import queued_job_cancelled
from jobs.store import scoped, submission
from jobs.types import RETRYABLE_STATUSES, JobStatus
from ledon.bulk import BulkFilter, BulkProgress, run_bulk
from ledon.faults import add_fault_hook, remove_fault_hook
from tests.support.bulk import (
    Row,
    argv,
    assert_changed_exactly,
    held,
    run_command,
    table,
    written_out,
)
from tests.support.factories import JobSubmissionFactory

pytestmark = pytest.mark.django_db(transaction=True)

SCOPES = ("tenant-a", "tenant-b")
HANDLERS = ("reports.generate", "mail.send")
STATES = ("queued", "running", "failed", "succeeded", "cancelled", "interrupted")
#: Days before now each job of the world was created.
AGES = (0, 1, 2)
NOW = timezone.now()


def created(age: int) -> datetime:
    return NOW - timedelta(days=age, hours=1)


def make(
    job_id: str,
    *,
    scope: str = "tenant-a",
    handler: str = "reports.generate",
    state: str = "queued",
    age: int = 0,
    error: str = "boom",
    max_attempts: int = 1,
) -> None:
    """One job brought into ``state`` through the store, created ``age`` days ago."""
    at = created(age)
    sub = JobSubmissionFactory(handler=handler, max_attempts=max_attempts)
    snap = submission.submit(JobScope(scope).scope_hash, job_id, sub, now=at)
    if state == "queued":
        return
    if state == "cancelled":
        JobScope(scope).cancel(job_id)
        return
    claim = execution.try_start(snap.scope_hash, job_id, "w1", now=at)
    assert claim is not None
    if state == "failed":
        assert execution.fail(claim.token, error, now=at)
    elif state == "succeeded":
        assert execution.complete(claim.token, now=at)
    elif state == "interrupted":
        assert execution.interrupt(claim.token, error, now=at)


@pytest.fixture
def world() -> None:
    """Jobs of two scopes and two handlers, in every state, of three ages; a failed
    job's error says "Disk FULL" or "timeout"; mail jobs have two attempts, report
    jobs one."""
    for scope in SCOPES:
        for handler in HANDLERS:
            for state in STATES:
                for age in AGES:
                    make(
                        f"{scope}.{handler}.{state}.{age}",
                        scope=scope,
                        handler=handler,
                        state=state,
                        age=age,
                        error="Disk FULL on /var" if age % 2 == 0 else "timeout",
                        max_attempts=2 if handler == "mail.send" else 1,
                    )


def rows() -> dict[int, Row]:
    return table(Job)


def bulk_jobs(*args: str) -> str:
    return run_command("bulk_jobs", *args)


def cancelled_by_rules(row: Row) -> Row:
    if row["status"] == JobStatus.QUEUED:
        return {**row, "status": JobStatus.CANCELLED}
    if row["status"] == JobStatus.RUNNING:
        return {**row, "cancel_requested": True}
    return row


def retried_by_rules(row: Row, extra: int) -> Row:
    if row["status"] in RETRYABLE_STATUSES and row["attempt_count"] < row["max_attempts"] + extra:
        return {
            **row,
            "status": JobStatus.QUEUED,
            "max_attempts": row["max_attempts"] + extra,
            "granted_attempts": row["granted_attempts"] + extra,
            "error": "",
        }
    return row


#: The columns the rules speak of; the others a transition sets as it always does.
RULED = ("status", "cancel_requested", "max_attempts", "granted_attempts", "error")


def changed_exactly(
    before: dict[int, Row], options: dict[str, str], rule: Callable[[Row], Row]
) -> int:
    """The jobs the filter ``options`` selected are as ``rule`` makes them, the others
    as they were (:func:`~tests.support.bulk.assert_changed_exactly`); how many changed."""
    selects = written_out(
        options, name_field="handler", scope_hash=lambda v: JobScope(v).scope_hash
    )
    return assert_changed_exactly(before, rows(), selects=selects, rule=rule, ruled=RULED)


FILTERS = [
    {"scope": "tenant-a", "name": "mail.send"},
    {"status": "running"},
    {"status": "queued", "scope": "tenant-b"},
    {"since": created(1).isoformat(), "until": created(0).isoformat()},
    {"error_contains": "disk full"},
    {"name": "reports.generate", "since": created(1).isoformat()},
]


@pytest.mark.parametrize("options", FILTERS)
def test_cancel_changes_exactly_the_matching_jobs_by_the_rules(world, options):
    before = rows()

    output = bulk_jobs("cancel", *argv(options), "--batch-size", "7")

    changed = changed_exactly(before, options, cancelled_by_rules)
    assert f"changed {changed} (" in output


@pytest.mark.parametrize("extra", [0, 1])
@pytest.mark.parametrize("options", [*FILTERS, {"status": "failed", "error_contains": "TIMEOUT"}])
def test_retry_changes_exactly_the_matching_jobs_by_the_rules(world, options, extra):
    before = rows()

    output = bulk_jobs("retry", *argv(options), "--extra-attempts", str(extra))

    changed = changed_exactly(before, options, lambda row: retried_by_rules(row, extra))
    assert f"changed {changed} ({changed} re-queued)" in output


@pytest.mark.parametrize(
    ("operation", "extra", "skipped"),
    [
        # tenant-a's 36 jobs: 24 finished; 18 queued, running or succeeded.
        ("cancel", [], "24 already finished"),
        ("retry", ["--extra-attempts", "1"], "18 not failed, cancelled or interrupted"),
    ],
)
def test_a_dry_run_changes_nothing_and_counts_what_the_run_then_does(
    world, unchanged, operation, extra, skipped
):
    options = {"scope": "tenant-a", "since": created(2).isoformat()}
    with unchanged():
        dry = bulk_jobs(operation, *argv(options), *extra, "--dry-run")
    assert "nothing was changed" in dry

    done = bulk_jobs(operation, *argv(options), *extra)

    would = dry.split("would change ", 1)[1].split(",", 1)[0]
    assert f"changed {would}" in done
    assert skipped in dry


def test_the_dry_run_says_why_jobs_would_be_skipped(world):
    output = bulk_jobs("retry", "--status", "failed", "--dry-run")

    # Two scopes x three ages: the mail jobs have an attempt left, the reports none.
    assert "would change 6 (6 re-queued), would skip 6 (6 used all their attempts" in output


def test_the_library_jobs_are_left_out_unless_named(handler, unchanged):
    handler("lib.plumbing", library=True)(lambda ctx: None)
    make("plumbing", handler="lib.plumbing")
    make("work", handler="app.work")

    bulk_jobs("cancel", "--status", "queued")

    assert Job.objects.get(job_id="plumbing").status == JobStatus.QUEUED
    assert Job.objects.get(job_id="work").status == JobStatus.CANCELLED
    bulk_jobs("cancel", "--name", "lib.plumbing")
    assert Job.objects.get(job_id="plumbing").status == JobStatus.CANCELLED


def test_progress_is_printed_per_batch_and_the_summary_at_the_end():
    for n in range(5):
        make(f"f{n}", state="failed", max_attempts=2)

    output = bulk_jobs("retry", "--status", "failed", "--batch-size", "2").splitlines()

    assert output[0] == "bulk_jobs retry: status='failed'"
    assert [line.split(":")[0] for line in output[1:4]] == ["batch 1", "batch 2", "batch 3"]
    assert output[1] == "batch 1: 2 of 5 — 2 re-queued, 0 skipped"
    assert output[-1].startswith("5 job(s) matched: changed 5 (5 re-queued), skipped 0")
    assert "3 batch(es)" in output[-1]


# --------------------------------------------------------------------------- bad input


BAD = [
    (["cancel", "--status", "bogus"], "--status must be one of"),
    (["cancel", "--since", "yesterday"], "--since must be an ISO 8601"),
    (["retry", "--until", "2026-13-01"], "--until must be an ISO 8601"),
    (["cancel", "--since", "2026-03-02", "--until", "2026-03-01"], "must be before --until"),
    (["cancel", "--since", "2026-03-01", "--until", "2026-03-01"], "must be before --until"),
    (["retry", "--status", "failed", "--extra-attempts", "-1"], "extra_attempts must be between"),
    (["retry", "--status", "failed", "--extra-attempts", "1001"], "extra_attempts must be"),
    (["cancel", "--status", "queued", "--batch-size", "0"], "batch size must be between"),
    (["cancel", "--scope", ""], "scope"),
    (["cancel", "--name", "bad\nname"], "--name must not contain control characters"),
    (["cancel"], "give at least one filter"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_is_refused_and_nothing_is_written(world, unchanged, args, message):
    with unchanged(), pytest.raises(CommandError, match=message):
        bulk_jobs(*args)


def test_every_job_needs_all(world):
    bulk_jobs("cancel", "--all")
    assert not Job.objects.filter(status=JobStatus.QUEUED).exists()
    assert not Job.objects.filter(status=JobStatus.RUNNING, cancel_requested=False).exists()


def test_the_api_raises_typed_errors_and_writes_nothing(world, unchanged):
    statuses = JobStatus.values
    with unchanged():
        with pytest.raises(InvalidInput, match="--status"):
            BulkFilter.parse(statuses=statuses, error=InvalidInput, status="done")
        with pytest.raises(InvalidInput, match="--since"):
            BulkFilter.parse(statuses=statuses, error=InvalidInput, since="2026-02-30")
        with pytest.raises(InvalidInput, match="before"):
            BulkFilter.parse(
                statuses=statuses, error=InvalidInput, since="2026-03-02", until="2026-03-01T00:00Z"
            )
        with pytest.raises(InvalidSubmission, match="extra_attempts"):
            jobs_bulk.retry_action(-1)
        with pytest.raises(InvalidSubmission, match="extra_attempts"):
            scoped.retry_many(list(rows()), extra_attempts=-2)
        everything = jobs_bulk.matching(BulkFilter())
        with pytest.raises(InvalidInput, match="batch size"):
            run_bulk(everything, jobs_bulk.cancel_action(), error=InvalidInput, batch_size=0)
        with transaction.atomic(), pytest.raises(InvalidInput, match=r"transaction\.atomic"):
            run_bulk(everything, jobs_bulk.cancel_action(), error=InvalidInput)


def test_a_time_without_an_offset_is_utc_and_a_date_its_midnight():
    selection = BulkFilter.parse(
        statuses=(), error=InvalidInput, since="2026-03-01", until="2026-03-01T12:30+02:00"
    )
    assert selection.since == datetime.fromisoformat("2026-03-01T00:00:00+00:00")
    assert selection.until == datetime.fromisoformat("2026-03-01T10:30:00+00:00")


# --------------------------------------------------------------------------- the store


def test_each_rule_is_one_guarded_statement_per_batch(world):
    ids = list(rows())
    with CaptureQueriesContext(connection) as retry:
        outcome = scoped.retry_many(ids, extra_attempts=1)
    with CaptureQueriesContext(connection) as cancel:
        scoped.cancel_many(ids)

    def updates(queries: CaptureQueriesContext) -> list[str]:
        # On PostgreSQL a cancel's UPDATE is the first CTE of its statement (with what
        # follows in batches and sequences).
        return [
            q["sql"] for q in queries if q["sql"].startswith(("UPDATE", "WITH moved AS (UPDATE"))
        ]

    assert len(updates(retry)) == 1
    assert "IN ('failed', 'cancelled', 'interrupted')" in updates(retry)[0].replace('"', "")
    # Queued -> Cancelled, Running -> asked to stop.
    assert len(updates(cancel)) == 2
    # Failed, cancelled, interrupted: 2 scopes x 2 handlers x 3 ages each.
    assert outcome.changed == {scoped.REQUEUED: 36}


def test_a_bulk_cancel_tells_the_owner_of_each_cancelled_queued_job():
    make("q1")
    make("q2", scope="tenant-b")
    make("r1", state="running")
    heard: list[tuple[str, str]] = []

    def receiver(sender: Any, *, scope_hash: str, job_id: str, **kwargs: Any) -> None:
        heard.append((scope_hash, job_id))

    queued_job_cancelled.connect(receiver)
    try:
        bulk_jobs("cancel", "--all")
    finally:
        queued_job_cancelled.disconnect(receiver)
    assert sorted(heard) == sorted(
        [(JobScope("tenant-a").scope_hash, "q1"), (JobScope("tenant-b").scope_hash, "q2")]
    )


# --------------------------------------------------------------------------- meanwhile


@pytest.fixture
def at_each_page() -> Iterator[Callable[[Callable[[dict[str, Any]], None]], None]]:
    """``at_each_page(fn)``: ``fn(context)`` runs where a run has read a page of ids and
    not yet applied its batch (the ``ledon.bulk.page`` fault point)."""
    hooks: list[Any] = []

    def register(fn: Callable[[dict[str, Any]], None]) -> None:
        def hook(name: str, context: dict[str, Any]) -> None:
            if name == "ledon.bulk.page":
                fn(context)

        hooks.append(hook)
        add_fault_hook(hook)

    yield register
    for hook in hooks:
        remove_fault_hook(hook)


def test_a_job_a_worker_claims_while_a_bulk_cancel_runs_is_asked_to_stop(at_each_page, background):
    make("busy")
    claims: list[Any] = []

    def worker_claims(context: dict[str, Any]) -> None:
        if not claims:
            claims.append(background(lambda: execution.claim_due("w2", limit=1)).result(30))

    at_each_page(worker_claims)
    report = run_bulk(
        jobs_bulk.matching(BulkFilter(status="queued")),
        jobs_bulk.cancel_action(),
        error=InvalidInput,
    )

    (claim,) = claims[0]
    assert report.changed == {scoped.CANCELLED: 0, scoped.CANCEL_REQUESTED: 1}
    job = Job.objects.get(job_id="busy")
    assert (job.status, job.cancel_requested) == (JobStatus.RUNNING, True)
    # Its handler returns: the job ends Cancelled, as a cancel request says.
    execution.complete(claim.token, "ignored")
    assert Job.objects.get(job_id="busy").status == JobStatus.CANCELLED


def test_jobs_submitted_during_a_run_are_not_touched(at_each_page):
    for n in range(3):
        make(f"old-{n}")
    pages: list[Any] = []

    def submit_another(context: dict[str, Any]) -> None:
        pages.append(context["ids"])
        make(f"new-{len(pages)}")

    at_each_page(submit_another)

    report = run_bulk(
        jobs_bulk.matching(BulkFilter(status="queued")),
        jobs_bulk.cancel_action(),
        error=InvalidInput,
        batch_size=1,
    )

    assert len(pages) == 3
    assert report.matched == 3
    assert report.changed[scoped.CANCELLED] == 3
    new = Job.objects.filter(job_id__startswith="new-")
    assert set(new.values_list("status", flat=True)) == {JobStatus.QUEUED}
    assert new.count() == 3


@pytest.mark.postgres_only
def test_a_batch_skips_a_job_a_claim_holds_and_asks_it_to_stop_once_claimed(
    at_each_page, background
):
    """The claim's transaction holds the row when the batch comes: the batch does not
    wait for it (the claim commits only after the batch has returned); the job is
    tried again after the pass, and asked to stop."""
    make("contested")
    make("free")
    holding, release = threading.Event(), threading.Event()

    def claim_and_hold() -> Any:
        with transaction.atomic():
            claim = execution.claim_due("w2", limit=1)
            holding.set()
            release.wait(30)
        return claim

    claimed: list[Any] = []

    def start_claim(context: dict[str, Any]) -> None:
        if not claimed:
            claimed.append(background(claim_and_hold))
            assert holding.wait(30)

    def let_it_commit(progress: BulkProgress) -> None:
        if progress.held and not release.is_set():
            release.set()
            claimed[0].result(30)

    at_each_page(start_claim)
    report = run_bulk(
        jobs_bulk.matching(BulkFilter(status="queued")),
        jobs_bulk.cancel_action(),
        error=InvalidInput,
        on_batch=let_it_commit,
    )

    assert release.is_set(), "the batch never reported the held job"
    (claim,) = claimed[0].result()
    contested = Job.objects.get(job_id=claim.job_id)
    assert (contested.status, contested.cancel_requested) == (JobStatus.RUNNING, True)
    assert report.changed == {scoped.CANCELLED: 1, scoped.CANCEL_REQUESTED: 1}
    assert report.held == 0


@pytest.mark.postgres_only
def test_a_row_held_on_every_try_is_reported_and_left(at_each_page, background):
    make("locked", state="failed", max_attempts=2)
    make("other", state="failed", max_attempts=2)
    with held(background, Job.objects.filter(job_id="locked")):
        report = run_bulk(
            jobs_bulk.matching(BulkFilter(status="failed")),
            jobs_bulk.retry_action(),
            error=InvalidInput,
        )

    assert (report.changed, report.held, report.skipped) == ({scoped.REQUEUED: 1}, 1, 0)
    assert "unchanged: run it again" in report.summary("job(s)")
    assert Job.objects.get(job_id="locked").status == JobStatus.FAILED
    assert Job.objects.get(job_id="other").status == JobStatus.QUEUED


def test_a_job_that_no_longer_matches_when_its_turn_comes_is_left_and_counted(at_each_page):
    for n in range(3):
        make(f"f{n}", state="failed", max_attempts=2)

    def someone_retries_the_last(context: dict[str, Any]) -> None:
        if Job.objects.get(job_id="f2").status == JobStatus.FAILED:
            JobScope("tenant-a").retry("f2")

    at_each_page(someone_retries_the_last)
    report = run_bulk(
        jobs_bulk.matching(BulkFilter(status="failed")),
        jobs_bulk.retry_action(extra_attempts=1),
        error=InvalidInput,
        batch_size=1,
    )

    assert (report.matched, report.changed, report.skipped, report.gone) == (
        3, {scoped.REQUEUED: 2}, 0, 1
    )  # fmt: skip
    assert "1 no longer matched when reached" in report.summary("job(s)")
    # Retried once, by someone else, with no attempt granted by the run.
    assert Job.objects.get(job_id="f2").max_attempts == 2


def failed_with_key(job_id: str, key: str) -> None:
    sub = JobSubmission.create("reports.generate", {"id": job_id}, unique_key=key)
    snap = submit_job("tenant-a", job_id, sub)
    claim = execution.try_start(snap.scope_hash, job_id, "w1")
    assert claim is not None
    assert execution.fail(claim.token, "boom")


def test_a_retry_leaves_a_job_whose_unique_key_another_job_holds(unchanged):
    """Queued again, it would hold the key twice: the batch's statement meets the
    unique index, and the jobs go one by one, that one left as it is."""
    failed_with_key("held", "sync:1")
    submit_job(
        "tenant-a", "holder", JobSubmission.create("reports.generate", {}, unique_key="sync:1")
    )
    failed_with_key("twin-1", "sync:2")
    failed_with_key("twin-2", "sync:2")
    make("plain", state="failed")

    output = bulk_jobs("retry", "--status", "failed", "--extra-attempts", "1")

    assert "4 job(s) matched: changed 2 (2 re-queued), skipped 2" in output
    status = dict(Job.objects.values_list("job_id", "status"))
    assert status == {
        "held": JobStatus.FAILED,
        "holder": JobStatus.QUEUED,
        "twin-1": JobStatus.QUEUED,
        "twin-2": JobStatus.FAILED,
        "plain": JobStatus.QUEUED,
    }
    # One job's retry says why, and changes nothing.
    with unchanged(), pytest.raises(InvalidTransition, match="holds its unique key 'sync:1'"):
        JobScope("tenant-a").retry("held", extra_attempts=1)
