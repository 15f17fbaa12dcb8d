"""The trust boundary of the scoped API, and bad input gets a typed error and
changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs import execution, store
from jobs.api import JobScope, stage_job, submit_job
from jobs.exceptions import (
    InvalidInput,
    InvalidJobId,
    InvalidPayload,
    InvalidScope,
    InvalidSubmission,
    JobNotFound,
    JobsError,
)
from jobs.models import Job
from jobs.types import JobStatus, JobSubmission
from tests.support.factories import JobSubmissionFactory

SCOPE = "tenant-42"
OTHER = "tenant-43"
T0 = datetime(2024, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.django_db
class TestTrustBoundary:
    @pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED])
    def test_another_scope_cannot_reach_a_job(self, make_job, unchanged, status) -> None:
        if status is JobStatus.QUEUED:
            make_job.queued("job-1", max_attempts=2)
        elif status is JobStatus.RUNNING:
            make_job.running("job-1", max_attempts=2)
        else:
            make_job.finished(status, "job-1", max_attempts=2)
        other = JobScope(OTHER)
        with unchanged():
            assert other.get("job-1") is None
            assert other.list() == []
            assert other.list(status=status) == []
            with pytest.raises(JobNotFound):
                other.cancel("job-1")
            with pytest.raises(JobNotFound):
                other.retry("job-1")
        assert JobScope(SCOPE).get("job-1") is not None

    def test_another_scope_creates_its_own_job(self, make_job) -> None:
        make_job.queued("job-1", payload="mine")
        theirs = JobScope(OTHER).submit("job-1", JobSubmissionFactory(payload="theirs"))
        assert theirs.created
        assert make_job.get("job-1").payload == "mine"

    def test_get_returns_the_job_with_its_attempts(self, make_job, scope) -> None:
        claim = make_job.running("job-1")
        snap = scope.get("job-1")
        assert snap is not None
        assert (snap.job_id, snap.status, snap.attempt_count) == ("job-1", JobStatus.RUNNING, 1)
        assert [a.number for a in snap.attempts] == [claim.attempt]
        assert snap.attempts[0].worker_id == "w1"
        assert scope.get("nope") is None

    def test_list_returns_every_job_oldest_first(self, scope) -> None:
        sub = JobSubmissionFactory()
        # Created out of insertion order: the listing follows created_at, not the id.
        order = [3, 0, 2, 1]
        for n in order:
            store.submit(scope.scope_hash, f"job-{n}", sub, now=T0 + timedelta(microseconds=n))
        for n in range(150):
            store.submit(
                scope.scope_hash, f"later-{n:03}", sub, now=T0 + timedelta(hours=1, seconds=n)
            )
        store.submit(JobScope(OTHER).scope_hash, "foreign", sub, now=T0)

        listed = [s.job_id for s in scope.list()]
        assert listed == [f"job-{n}" for n in range(4)] + [f"later-{n:03}" for n in range(150)]
        assert [s.job_id for s in scope.list(limit=3)] == ["job-0", "job-1", "job-2"]
        assert scope.list(limit=0) == []

    def test_list_filters(self, make_job, scope) -> None:
        make_job.queued("queued", queue="fast")
        make_job.running("running")
        make_job.finished(JobStatus.FAILED, "failed")
        make_job.finished(JobStatus.SUCCEEDED, "succeeded", handler="other.handler")

        def ids(**filters: Any) -> list[str]:
            return [s.job_id for s in scope.list(**filters)]

        assert ids(status=JobStatus.RUNNING) == ["running"]
        assert ids(status="failed") == ["failed"]
        assert ids(status=[JobStatus.QUEUED, "succeeded"]) == ["queued", "succeeded"]
        assert ids(status=()) == []
        assert ids(queue="fast") == ["queued"]
        assert ids(handler="other.handler") == ["succeeded"]
        assert ids(status=JobStatus.FAILED, limit=1) == ["failed"]
        assert len(ids()) == 4

    @pytest.mark.parametrize(
        "filters",
        [{"status": "bogus"}, {"status": ["queued", "nope"]}, {"limit": -1}, {"limit": True}],
    )
    def test_list_rejects_bad_filters(self, scope, filters: dict[str, Any]) -> None:
        with pytest.raises(InvalidInput):
            scope.list(**filters)

    @pytest.mark.parametrize(
        ("status", "named"),
        [
            (5, "not int"),
            (object(), "not object"),
            (b"queued", "not bytes"),
            ({"queued": 1}, "not dict"),
            ([JobStatus.QUEUED, 5], "a job status is a str, not int"),
            ([["queued"]], "a job status is a str, not list"),
        ],
    )
    def test_a_status_of_the_wrong_type_is_a_typed_error(self, make_job, scope, status, named):
        make_job.queued("queued")
        with pytest.raises(InvalidInput, match=named):
            scope.list(status=status)
        assert [s.job_id for s in scope.list(status={JobStatus.QUEUED})] == ["queued"]


def _scope() -> JobScope:
    return JobScope(SCOPE)


BAD_INPUT: list[tuple[str, Callable[[], Any], type[JobsError]]] = [
    ("submit-empty-scope", lambda: submit_job("", "j", JobSubmissionFactory()), InvalidScope),
    ("submit-int-scope", lambda: submit_job(7, "j", JobSubmissionFactory()), InvalidScope),
    ("submit-bad-job-id", lambda: submit_job(SCOPE, "a\tb", JobSubmissionFactory()), InvalidJobId),
    ("submit-dict-submission", lambda: submit_job(SCOPE, "j", {"handler": "h"}), InvalidSubmission),
    ("stage-none-submission", lambda: _staged(SCOPE, "j", None), InvalidSubmission),
    ("stage-bad-scope", lambda: _staged("\ud800", "j", JobSubmissionFactory()), InvalidScope),
    ("stage-bad-job-id", lambda: _staged(SCOPE, "x" * 201, JobSubmissionFactory()), InvalidJobId),
    ("handler-name", lambda: JobSubmissionFactory(handler="bad name!"), InvalidSubmission),
    ("handler-empty", lambda: JobSubmissionFactory(handler=""), InvalidSubmission),
    ("handler-long", lambda: JobSubmissionFactory(handler="h" * 201), InvalidSubmission),
    ("version-zero", lambda: JobSubmissionFactory(version=0), InvalidSubmission),
    ("version-bool", lambda: JobSubmissionFactory(version=True), InvalidSubmission),
    ("version-str", lambda: JobSubmissionFactory(version="1"), InvalidSubmission),
    ("queue-empty", lambda: JobSubmissionFactory(queue=""), InvalidSubmission),
    ("queue-long", lambda: JobSubmissionFactory(queue="q" * 101), InvalidSubmission),
    ("max-attempts-zero", lambda: JobSubmissionFactory(max_attempts=0), InvalidSubmission),
    ("max-attempts-huge", lambda: JobSubmissionFactory(max_attempts=10**6), InvalidSubmission),
    ("priority-high", lambda: JobSubmissionFactory(priority=101), InvalidSubmission),
    ("priority-float", lambda: JobSubmissionFactory(priority=1.5), InvalidSubmission),
    ("not-before-str", lambda: JobSubmissionFactory(not_before="2030-01-01"), InvalidSubmission),
    ("payload-nan", lambda: JobSubmissionFactory(payload=float("nan")), InvalidPayload),
    ("payload-json-bytes", lambda: JobSubmission(handler="h", payload_json=b"{}"), InvalidPayload),
    ("get-none", lambda: _scope().get(None), InvalidJobId),
    ("cancel-none", lambda: _scope().cancel(None), InvalidJobId),
    ("retry-none", lambda: _scope().retry(None), InvalidJobId),
    ("cancel-empty", lambda: _scope().cancel(""), InvalidJobId),
    ("retry-naive", lambda: _scope().retry("job-1", datetime(2030, 1, 1)), InvalidSubmission),
    ("get-due-negative", lambda: execution.get_due(limit=-1), InvalidInput),
    ("claim-zero", lambda: execution.claim_due("w1", limit=0), InvalidSubmission),
    ("claim-bool", lambda: execution.claim_due("w1", limit=True), InvalidSubmission),
    ("claim-worker-nul", lambda: execution.claim_due("w\x00", limit=1), InvalidSubmission),
    ("try-start-scope", lambda: execution.try_start(SCOPE, "job-1"), InvalidScope),
    ("try-start-job-id", lambda: execution.try_start("a" * 64, ""), InvalidJobId),
    ("try-start-none", lambda: execution.try_start("a" * 64, None), InvalidJobId),
    ("complete-no-token", lambda: execution.complete(None), InvalidInput),
    ("status-no-token", lambda: execution.get_execution_status(""), InvalidInput),
    ("naive-now", lambda: execution.get_due(now=datetime(2030, 1, 1)), InvalidInput),
]


def _staged(scope: Any, job_id: Any, submission: Any) -> Any:
    with transaction.atomic():
        return stage_job(scope, job_id, submission)


@pytest.mark.django_db
class TestRBadInput:
    @pytest.mark.parametrize(
        ("call", "error"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
    )
    def test_typed_error_and_nothing_written(self, make_job, unchanged, call, error) -> None:
        make_job.finished(JobStatus.FAILED, "job-1", max_attempts=2)
        make_job.queued("job-2")
        with unchanged(), pytest.raises(error) as exc:
            call()
        assert isinstance(exc.value, JobsError)
        assert str(exc.value)

    def test_oversized_payload(self, settings) -> None:
        settings.JOBS = {**settings.JOBS, "MAX_PAYLOAD_BYTES": 100}
        assert JobSubmissionFactory(payload="x" * 90).payload == "x" * 90
        with pytest.raises(InvalidPayload, match="100 bytes"):
            JobSubmissionFactory(payload="x" * 99)
        with pytest.raises(InvalidPayload):
            JobSubmission(handler="h", payload_json='"' + "é" * 50 + '"')
        assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_cancel_queued_cancels_the_queued_jobs_of_one_scope_by_id_prefix(make_job) -> None:
    for job_id in ("wf:1.0:timer", "wf:1.0:retry", "wf:12.0:timer", "other"):
        make_job.queued(job_id)
    make_job.queued("wf:1.0:timer", scope="tenant-else")
    running = make_job.running("wf:1.0:running")
    assert store.cancel_queued(make_job.scope_hash, ["wf:1.", "nothing-"]) == 2
    statuses = dict(
        Job.objects.filter(scope_hash=make_job.scope_hash).values_list("job_id", "status")
    )
    assert statuses == {
        "wf:1.0:timer": "cancelled",
        "wf:1.0:retry": "cancelled",
        "wf:12.0:timer": "queued",
        "other": "queued",
        "wf:1.0:running": "running",
    }
    assert Job.objects.exclude(scope_hash=make_job.scope_hash).get().status == "queued"
    assert store.cancel_queued(make_job.scope_hash, []) == 0
    assert running.job_id == "wf:1.0:running"


@pytest.mark.django_db(transaction=True)
def test_cancel_running_asks_the_running_jobs_of_one_scope_to_stop_by_id_prefix(make_job) -> None:
    for job_id in ("wf-item:1.0:a:0", "wf-item:1.0:a:1", "wf-item:12.0:a:0", "other"):
        make_job.running(job_id)
    make_job.running("wf-item:1.0:a:0", scope="tenant-else")
    make_job.queued("wf-item:1.0:a:9")
    with CaptureQueriesContext(connection) as writes:
        assert store.cancel_running(make_job.scope_hash, ["wf-item:1.", "nothing-"]) == 2
    asked = dict(
        Job.objects.filter(scope_hash=make_job.scope_hash).values_list("job_id", "cancel_requested")
    )
    assert asked == {
        "wf-item:1.0:a:0": True,
        "wf-item:1.0:a:1": True,
        "wf-item:12.0:a:0": False,
        "other": False,
        "wf-item:1.0:a:9": False,  # queued: cancel_queued's
    }
    assert not Job.objects.exclude(scope_hash=make_job.scope_hash).get().cancel_requested
    updates = [q for q in writes.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 1  # one statement, however many jobs
    # Asked already: not again.
    assert store.cancel_running(make_job.scope_hash, ["wf-item:1."]) == 0
    assert store.cancel_running(make_job.scope_hash, []) == 0
