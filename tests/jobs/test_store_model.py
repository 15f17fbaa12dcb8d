"""The jobs store against a model: random sequences of every transition, from several
workers, with current and stale tokens and leases that expire and are recovered,
checked against a plain-Python model of the lifecycle after every step (Hypothesis
stateful testing), on SQLite and PostgreSQL.

The short profile runs in the suite (a few seconds); ``LEDON_MODEL_EXAMPLES=500``
(and ``LEDON_MODEL_STEPS``) runs a long one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from jobs import JobSubmission, execution
from jobs.api import JobScope, submit_job
from jobs.exceptions import InvalidTransition
from jobs.models import Job, JobAttempt
from jobs.types import CancelOutcome, FinishOutcome
from jobs.validation import scope_hash

SCOPE = "model"
JOB_IDS = ["a", "b", "c"]
WORKERS = ["w1", "w2"]
EXAMPLES = int(os.environ.get("LEDON_MODEL_EXAMPLES", "6"))
STEPS = int(os.environ.get("LEDON_MODEL_STEPS", "25"))

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # A long profile runs for as long as it needs (about 0.05 s a step on PostgreSQL).
    pytest.mark.timeout(max(120, EXAMPLES * STEPS // 2)),
]

LEASE = 30
RETRYABLE = {"failed", "cancelled", "interrupted"}


@dataclass
class ModelJob:
    max_attempts: int
    status: str = "queued"
    attempts: int = 0
    token: str | None = None
    cancel: bool = False
    #: None: due whenever (submitted or retried "now", before the model's clock).
    run_at: datetime | None = None
    progress: float | None = None
    leased_by: str = ""
    lease_until: datetime | None = None

    def due(self, now: datetime) -> bool:
        return (
            self.status == "queued"
            and not self.cancel
            and (self.run_at is None or self.run_at <= now)
            and self.attempts < self.max_attempts
        )

    def holds(self, token: str) -> bool:
        return self.status == "running" and self.token == token

    def end(self, status: str) -> None:
        self.status = status

    def start(self, token: str, worker: str, now: datetime) -> None:
        self.attempts += 1
        self.status, self.token, self.progress, self.cancel = "running", token, None, False
        self.leased_by, self.lease_until = worker, now + timedelta(seconds=LEASE)

    def requeue(self, run_at: datetime | None) -> None:
        self.status = "queued"
        self.run_at = run_at
        self.token = None
        self.cancel = False
        self.progress = None


class JobsStoreModel(RuleBasedStateMachine):
    tokens = Bundle("tokens")

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, ModelJob] = {}
        # Far ahead of the wall clock: a job submitted or retried "now" is due.
        self.now = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)

    @initialize()
    def empty_store(self) -> None:
        JobAttempt.objects.all().delete()
        Job.objects.all().delete()

    # ------------------------------------------------------------------ time

    @rule(seconds=st.sampled_from([1, 30, 600]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    # ------------------------------------------------------------------ caller

    @rule(job_id=st.sampled_from(JOB_IDS), max_attempts=st.integers(1, 3))
    def submit(self, job_id: str, max_attempts: int) -> None:
        existing = self.jobs.get(job_id)
        attempts = existing.max_attempts if existing else max_attempts
        snapshot = submit_job(
            SCOPE, job_id, JobSubmission.create("test.record", {}, max_attempts=attempts)
        )
        assert snapshot.created == (existing is None)
        if existing is None:
            self.jobs[job_id] = ModelJob(max_attempts)

    @rule(job_id=st.sampled_from(JOB_IDS))
    def cancel(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        outcome = JobScope(SCOPE).cancel(job_id)
        if job.status == "queued":
            assert outcome is CancelOutcome.CANCELLED
            job.end("cancelled")
        elif job.status == "running":
            assert outcome is CancelOutcome.REQUESTED
            job.cancel = True
        else:
            assert outcome is CancelOutcome.ALREADY_FINISHED

    @rule(job_id=st.sampled_from(JOB_IDS))
    def retry(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        allowed = job.status in RETRYABLE and job.attempts < job.max_attempts
        try:
            JobScope(SCOPE).retry(job_id)
        except InvalidTransition:
            assert not allowed
            return
        assert allowed
        job.requeue(None)

    # ------------------------------------------------------------------ executor

    @rule(target=tokens, job_id=st.sampled_from(JOB_IDS), worker=st.sampled_from(WORKERS))
    def try_start(self, job_id: str, worker: str) -> MultipleResults[str]:
        job = self.jobs.get(job_id)
        if job is None:
            return multiple()  # (try_start of an unknown job id raises: not a transition)
        claim = execution.try_start(
            scope_hash(SCOPE), job_id, worker, lease_seconds=LEASE, now=self.now
        )
        if not job.due(self.now):
            assert claim is None
            return multiple()
        assert claim is not None
        job.start(claim.token, worker, self.now)
        assert claim.attempt == job.attempts
        return multiple(claim.token)

    @rule(target=tokens, worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def claim_due(self, worker: str, limit: int) -> MultipleResults[str]:
        due = {job_id for job_id, job in self.jobs.items() if job.due(self.now)}
        claims = execution.claim_due(worker, limit=limit, lease_seconds=LEASE, now=self.now)
        assert len(claims) == min(limit, len(due))
        for claim in claims:
            assert claim.job_id in due
            job = self.jobs[claim.job_id]
            job.start(claim.token, worker, self.now)
            assert claim.attempt == job.attempts
        return multiple(*(claim.token for claim in claims))

    @rule(token=tokens, value=st.sampled_from([10.0, 50.0, 90.0]))
    def report_progress(self, token: str, value: float) -> None:
        job = self._holder(token)
        recorded = execution.report_progress(token, value, now=self.now)
        expected = (
            job is not None and not job.cancel and (job.progress is None or job.progress <= value)
        )
        assert recorded == expected
        if expected:
            assert job is not None
            job.progress = value

    @rule(token=tokens)
    def complete(self, token: str) -> None:
        job = self._holder(token)
        outcome = execution.complete(token, now=self.now)
        if job is None:
            assert outcome is FinishOutcome.STALE
            return
        expected = "cancelled" if job.cancel else "succeeded"
        assert outcome.value == expected
        job.end(expected)

    @rule(token=tokens, retry=st.booleans())
    def fail(self, token: str, retry: bool) -> None:
        job = self._holder(token)
        retry_at = self.now + timedelta(seconds=30) if retry else None
        outcome = execution.fail(token, "boom", retry_at=retry_at, now=self.now)
        self._ended(job, outcome, "failed", retry_at)

    @rule(token=tokens)
    def interrupt(self, token: str) -> None:
        job = self._holder(token)
        outcome = execution.interrupt(token, now=self.now)
        self._ended(job, outcome, "interrupted", None)

    @rule(token=tokens, requeue=st.booleans())
    def recover(self, token: str, requeue: bool) -> None:
        job = self._holder(token)
        outcome = execution.recover(token, requeue=requeue, now=self.now)
        self._ended(job, outcome, "interrupted", self.now if requeue else None)

    @rule(token=tokens)
    def snooze(self, token: str) -> None:
        job = self._holder(token)
        run_at = self.now + timedelta(seconds=30)
        outcome = execution.snooze(token, run_at, now=self.now)
        if job is None:
            assert outcome is FinishOutcome.STALE
        elif job.cancel:
            assert outcome is FinishOutcome.CANCELLED
            job.end("cancelled")
        else:
            assert outcome is FinishOutcome.SNOOZED
            job.attempts -= 1
            job.requeue(run_at)

    @rule(token=tokens, worker=st.sampled_from(WORKERS))
    def heartbeat(self, token: str, worker: str) -> None:
        job = self._holder(token)
        statuses = execution.heartbeat([token], worker, lease_seconds=LEASE, now=self.now)
        if job is None or job.leased_by != worker:
            assert statuses[token].name == "ENDED"
            return
        assert statuses[token].name == ("CANCEL_REQUESTED" if job.cancel else "ACTIVE")
        job.lease_until = self.now + timedelta(seconds=LEASE)

    @rule(requeue=st.booleans())
    def recover_expired(self, requeue: bool) -> None:
        expired = {
            job.token: job
            for job in self.jobs.values()
            if job.status == "running" and job.lease_until and job.lease_until < self.now
        }
        outcomes = execution.recover_expired(requeue=requeue, now=self.now)
        assert set(outcomes) == set(expired)
        for token, job in expired.items():
            self._ended(job, outcomes[token], "interrupted", self.now if requeue else None)

    @rule(worker=st.sampled_from(WORKERS))
    def recover_worker(self, worker: str) -> None:
        own = {
            job.token: job
            for job in self.jobs.values()
            if job.status == "running" and job.leased_by == worker
        }
        outcomes = execution.recover_worker(worker, now=self.now)
        assert set(outcomes) == set(own)
        for token, job in own.items():
            self._ended(job, outcomes[token], "interrupted", self.now)

    # ------------------------------------------------------------------ checks

    @invariant()
    def the_store_matches_the_model(self) -> None:
        rows = {
            job.job_id: job
            for job in Job.objects.filter(scope_hash=scope_hash(SCOPE)).prefetch_related("attempts")
        }
        assert set(rows) == set(self.jobs)
        for job_id, model in self.jobs.items():
            row = rows[job_id]
            where = f"job {job_id}: {model}"
            assert row.status == model.status, where
            assert row.attempt_count == model.attempts, where
            assert row.cancel_requested == model.cancel, where
            running = [a for a in row.attempts.all() if a.status == "running"]
            if model.status == "running":
                assert row.current_token == model.token, where
                assert row.leased_by == model.leased_by, where
                assert row.lease_expires_at == model.lease_until, where
                assert [a.token for a in running] == [model.token], where
                assert row.progress == model.progress, where
            else:
                assert not running, where
            counted = [a for a in row.attempts.all() if a.status != "snoozed"]
            assert len(counted) == row.attempt_count, where

    # ------------------------------------------------------------------ helpers

    def _holder(self, token: str) -> ModelJob | None:
        """The job whose current, Running attempt ``token`` is (None: stale)."""
        for job in self.jobs.values():
            if job.holds(token):
                return job
        return None

    def _ended(
        self,
        job: ModelJob | None,
        outcome: FinishOutcome,
        status: str,
        requeue_at: datetime | None,
    ) -> None:
        if job is None:
            assert outcome is FinishOutcome.STALE
            return
        if job.cancel:
            assert outcome is FinishOutcome.CANCELLED
            job.end("cancelled")
            return
        if requeue_at is not None and job.attempts < job.max_attempts:
            assert outcome is FinishOutcome.REQUEUED
            job.requeue(requeue_at)
            return
        assert outcome.value == status
        job.end(status)


def test_the_jobs_store_follows_its_model():
    run_state_machine_as_test(
        JobsStoreModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
