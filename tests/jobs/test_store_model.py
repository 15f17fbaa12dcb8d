"""The jobs store against a model: random sequences of every transition, from several
workers, with current and stale tokens and leases that expire and are recovered,
checked against a plain-Python model of the lifecycle after every step (Hypothesis
stateful testing), on SQLite and PostgreSQL.

Jobs ``a`` and ``b`` are one batch (with a ``then`` due far in the future, which no
step claims), and ``b`` and ``c`` one sequence: after every step the batch's counts
are the model's, its ``then`` exists once both of its jobs were final at once, and
the sequence holds what the model holds (a job of the sequence is claimable only
while no earlier one is Queued or Running).

The transitions driven: submit (new and duplicate, with or without a start deadline),
a debounced submit (a new job, or the Queued job that holds the key replaced, or the
identity rule), a submit with a limit key (its handler runs one job per key at once:
the claims hold the key's other jobs), a submit with a limit key whose handler has a
rate per key with a burst (a token bucket per key: the claims start at most its room
and hold the rest until time refills it), the expiry sweep, cancel, retry (with and without
extra attempts granted), try_start, claim_due, report_progress, complete, fail (with
and without a retry), interrupt, recover, snooze (up to its ``max_snoozes`` bound),
release (a worker's graceful shutdown), the put-back of a claim whose handler the
worker does not know (within and past its window), heartbeat, lease expiry and
recovery of expired leases and of a restarted worker (also a recovery acting on a
token it picked before a heartbeat or another worker's claim) under the crash budget
(``JOBS["MAX_INTERRUPTIONS"]`` drawn from 1 to 3 per sequence, so that sequences reach
it). After every step each job's status, attempt, snooze, release and interruption
counts, whether it keeps killing its worker, ``max_attempts``, cancel flag, token,
lease, ``next_run_at``, start deadline, unknown-handler window and its attempt rows (number, token,
status) are compared with the model.

The suite runs a short profile: 60 sequences on SQLite and 30 on PostgreSQL, a
few seconds each. ``LEDON_MODEL_EXAMPLES=300`` runs a long one, and
``LEDON_MODEL_STEPS=100`` with it sequences long enough to reach, now and then, the
end of an unknown handler's window.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings
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

from jobs import JobSubmission, execution, store
from jobs.api import JobScope, submit_batch, submit_job
from jobs.conf import jobs_settings
from jobs.exceptions import InvalidTransition, JobIdentityConflict
from jobs.models import Batch, Job, JobAttempt, LimitCounter, RateBucket, Sequence
from jobs.store.rates import nanoseconds
from jobs.types import CancelOutcome, Claim, FinishOutcome
from jobs.validation import scope_hash

SCOPE = "model"
#: The handler of the keyed jobs: one Running job per limit key.
KEYED = "model.keyed"
#: The handler of the rated jobs: per limit key, a bucket of two starts that refills
#: one start every RATE_INTERVAL.
RATED = "model.rated"
RATE_INTERVAL = timedelta(seconds=600)
RATE_BURST = 2
JOB_IDS = ["a", "b", "c"]
WORKERS = ["w1", "w2"]
#: The short profile's sequences per database vendor, unless the environment says.
SHORT = {"sqlite": 60, "postgresql": 30}
#: 0: the short profile.
EXAMPLES = int(os.environ.get("LEDON_MODEL_EXAMPLES", "0"))
STEPS = int(os.environ.get("LEDON_MODEL_STEPS", "20"))

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # A long profile runs for as long as it needs (a few milliseconds a step).
    pytest.mark.timeout(max(120, EXAMPLES * STEPS // 2)),
]

LEASE = 30
#: The batch of jobs ``a`` and ``b``, and the sequence of jobs ``b`` and ``c``.
BATCH = ("a", "b")
KEYS = {"b": "s", "c": "s"}
#: The batch's then: due long after any step's clock.
THEN = JobSubmission.create("test.then", {}, not_before=datetime(2100, 1, 1, tzinfo=UTC))
FINAL = {"succeeded", "failed", "cancelled", "interrupted", "expired"}
#: How a token rule chooses its token (see ``JobsStoreModel._pick``): 0, the bundle's.
PICK = st.integers(0, 3)
RETRYABLE = {"failed", "cancelled", "interrupted"}


@dataclass
class ModelAttempt:
    number: int
    token: str
    status: str = "running"


@dataclass
class ModelJob:
    max_attempts: int
    #: What the caller submitted: a duplicate submission repeats it.
    submitted_attempts: int = 0
    status: str = "queued"
    attempts: int = 0
    snoozes: int = 0
    releases: int = 0
    #: Attempts recovered within the crash budget (not counted in ``attempts``).
    interruptions: int = 0
    #: Ended Interrupted at the crash budget: it keeps killing its worker.
    kills_its_worker: bool = False
    token: str | None = None
    cancel: bool = False
    #: None: due whenever (submitted or retried "now", before the model's clock).
    run_at: datetime | None = None
    progress: float | None = None
    leased_by: str = ""
    lease_until: datetime | None = None
    #: The first put-back of the unknown-handler window under way.
    unknown_since: datetime | None = None
    #: Its start deadline: not started by then, it never starts and expires.
    start_by: datetime | None = None
    #: A debounced job's key and its latest payload (None: not debounced).
    debounced: dict[str, int] | None = None
    #: The limit key its handler (``KEYED``: one Running per key) counts it under.
    limit_key: str = ""
    #: A job of ``RATED``: its limit key is a rate's (a bucket per key), not a count's.
    rated: bool = False
    #: Its sequence, and whether it waits there for an earlier job.
    key: str | None = None
    held: bool = False
    rows: list[ModelAttempt] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def due(self, now: datetime) -> bool:
        return (
            self.status == "queued"
            and not self.held
            and not self.cancel
            and (self.run_at is None or self.run_at <= now)
            and self.attempts < self.max_attempts
            and (self.start_by is None or self.start_by > now)
        )

    def lease_expired(self, now: datetime) -> bool:
        return self.lease_until is not None and self.lease_until < now

    def holds(self, token: str) -> bool:
        return self.status == "running" and self.token == token

    def end(self, status: str, attempt: str) -> None:
        """The running attempt ends ``attempt``, the job ``status``."""
        self.status = status
        self.close(attempt)

    def close(self, attempt: str) -> None:
        [running] = [row for row in self.rows if row.status == "running"]
        running.status = attempt
        self.token, self.leased_by, self.lease_until = None, "", None

    def start(self, token: str, worker: str, now: datetime) -> None:
        self.attempts += 1
        self.status, self.token, self.progress, self.cancel = "running", token, None, False
        self.leased_by, self.lease_until = worker, now + timedelta(seconds=LEASE)
        number = self.attempts + self.snoozes + self.releases + self.interruptions
        self.rows.append(ModelAttempt(number, token))

    def requeue(self, run_at: datetime | None) -> None:
        """Queued again for another reason than an unknown handler (a new window)."""
        self.status = "queued"
        self.run_at = run_at
        self.token = None
        self.cancel = False
        self.kills_its_worker = False
        self.progress = None
        self.unknown_since = None


class JobsStoreModel(RuleBasedStateMachine):
    tokens = Bundle("tokens")

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, ModelJob] = {}
        # Far ahead of the wall clock: a job submitted or retried "now" is due.
        self.now = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
        self.max_interruptions = jobs_settings().MAX_INTERRUPTIONS
        self.budget: override_settings | None = None
        self.then_submitted = False
        #: Per rated key, its bucket's theoretical arrival time (None: never used).
        self.tats: dict[str, datetime] = {}

    @initialize(
        max_attempts=st.lists(st.integers(1, 3), min_size=2, max_size=2),
        max_interruptions=st.integers(1, 3),
    )
    def empty_store(self, max_attempts: list[int], max_interruptions: int) -> None:
        self.budget = override_settings(
            JOBS={**getattr(django_settings, "JOBS", {}), "MAX_INTERRUPTIONS": max_interruptions}
        )
        self.budget.enable()
        self.max_interruptions = max_interruptions
        JobAttempt.objects.all().delete()
        Job.objects.all().delete()
        # The counts of the keyed jobs an earlier sequence left Running go with them,
        # and the rated keys' buckets with their starts.
        LimitCounter.objects.all().delete()
        RateBucket.objects.all().delete()
        Batch.objects.all().delete()
        Sequence.objects.all().delete()
        # Two jobs from the start, a batch, so that the steps reach the executor's
        # transitions early; the third is left for the submit rule to create.
        batch = submit_batch(
            SCOPE,
            "batch",
            [
                (job_id, self._submission(job_id, attempts, None))
                for job_id, attempts in zip(BATCH, max_attempts, strict=True)
            ],
            then=THEN,
        )
        assert batch.created
        for job_id, attempts in zip(BATCH, max_attempts, strict=True):
            self._created(job_id, ModelJob(attempts, submitted_attempts=attempts))
        # And two jobs of one rated key: a claim meets its bucket early.
        self.rated_submit("r1", "rx", 2)
        self.rated_submit("r2", "rx", 1)

    def _submission(self, job_id: str, attempts: int, start_by: datetime | None) -> JobSubmission:
        return JobSubmission.create(
            "test.record",
            {},
            max_attempts=attempts,
            start_by=start_by,
            sequence_key=KEYS.get(job_id),
        )

    def _created(self, job_id: str, job: ModelJob) -> None:
        """A new job: held if its sequence has another open job."""
        job.key = KEYS.get(job_id)
        job.held = job.key is not None and any(
            other.key == job.key and not other.final for other in self.jobs.values()
        )
        self.jobs[job_id] = job

    def teardown(self) -> None:
        if self.budget is not None:
            self.budget.disable()

    # ------------------------------------------------------------------ time

    @rule(seconds=st.sampled_from([1, 30, 600]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    # ------------------------------------------------------------------ caller

    @rule(
        job_id=st.sampled_from(JOB_IDS),
        max_attempts=st.integers(1, 3),
        deadline=st.sampled_from([None, None, 1, 30, 600]),
    )
    def submit(self, job_id: str, max_attempts: int, deadline: int | None = None) -> None:
        existing = self.jobs.get(job_id)
        # A repeat is the original request, whatever attempts retries granted since;
        # its deadline is not part of it: the job keeps the one it was created with.
        attempts = existing.submitted_attempts if existing else max_attempts
        start_by = None if deadline is None else self.now + timedelta(seconds=deadline)
        snapshot = submit_job(SCOPE, job_id, self._submission(job_id, attempts, start_by))
        assert snapshot.created == (existing is None)
        if existing is None:
            self._created(
                job_id, ModelJob(max_attempts, submitted_attempts=max_attempts, start_by=start_by)
            )

    @rule(job_id=st.sampled_from(["d1", "d2"]), value=st.integers(1, 2))
    def debounced_submit(self, job_id: str, value: int) -> None:
        payload = {"v": value}
        holder = next(
            (
                (held_id, job)
                for held_id, job in sorted(self.jobs.items())
                if job.debounced is not None and job.status == "queued"
            ),
            None,
        )
        existing = self.jobs.get(job_id)
        sub = JobSubmission.create("test.record", payload, unique_key="deb", debounce=30)
        try:
            snapshot = store.submit(scope_hash(SCOPE), job_id, sub, now=self.now)
        except JobIdentityConflict:
            assert holder is None
            assert existing is not None
            assert existing.debounced != payload
            return
        if holder is not None:
            held_id, job = holder
            assert (snapshot.job_id, snapshot.created) == (held_id, False)
            job.run_at, job.debounced = self.now + timedelta(seconds=30), payload
        elif existing is not None:
            assert (snapshot.job_id, snapshot.created) == (job_id, False)
            assert existing.debounced == payload
        else:
            assert snapshot.created
            self.jobs[job_id] = ModelJob(
                1, submitted_attempts=1, run_at=self.now + timedelta(seconds=30), debounced=payload
            )

    @rule(job_id=st.sampled_from(["k1", "k2", "k3"]), key=st.sampled_from(["x", "y"]))
    def keyed_submit(self, job_id: str, key: str) -> None:
        existing = self.jobs.get(job_id)
        key = existing.limit_key if existing is not None else key
        sub = JobSubmission.create(KEYED, {}, limit_key=key)
        snapshot = submit_job(SCOPE, job_id, sub)
        assert snapshot.created == (existing is None)
        if existing is None:
            self.jobs[job_id] = ModelJob(1, submitted_attempts=1, limit_key=key)

    @rule(
        job_id=st.sampled_from(["r1", "r2", "r3", "r4"]),
        key=st.sampled_from(["rx", "rx", "ry"]),
        max_attempts=st.integers(1, 3),
    )
    def rated_submit(self, job_id: str, key: str, max_attempts: int) -> None:
        existing = self.jobs.get(job_id)
        key = existing.limit_key if existing is not None else key
        attempts = existing.submitted_attempts if existing else max_attempts
        sub = JobSubmission.create(RATED, {}, limit_key=key, max_attempts=attempts)
        snapshot = submit_job(SCOPE, job_id, sub)
        assert snapshot.created == (existing is None)
        if existing is None:
            self.jobs[job_id] = ModelJob(
                attempts, submitted_attempts=attempts, limit_key=key, rated=True
            )

    @rule()
    def expire_jobs(self) -> None:
        late = [
            job
            for job in self.jobs.values()
            if job.status == "queued" and job.start_by is not None and job.start_by <= self.now
        ]
        assert execution.expire_jobs(now=self.now) == len(late)
        for job in late:
            job.status = "expired"

    @rule(job_id=st.sampled_from(JOB_IDS), pick=PICK)
    def cancel(self, job_id: str, pick: int) -> None:
        # ``pick`` as for a token (see ``_running``): most cancels reach a Running job.
        running = self._running(pick)
        if running is not None:
            job_id = running[0]
        job = self.jobs.get(job_id)
        if job is None:
            return
        outcome = JobScope(SCOPE).cancel(job_id)
        if job.status == "queued":
            assert outcome is CancelOutcome.CANCELLED
            job.status = "cancelled"
        elif job.status == "running":
            assert outcome is CancelOutcome.REQUESTED
            job.cancel = True
        else:
            assert outcome is CancelOutcome.ALREADY_FINISHED

    @rule(job_id=st.sampled_from(JOB_IDS), extra=st.sampled_from([0, 0, 1, 2]))
    def retry(self, job_id: str, extra: int) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        allowed = job.status in RETRYABLE and job.attempts < job.max_attempts + extra
        try:
            snapshot = JobScope(SCOPE).retry(job_id, extra_attempts=extra)
        except InvalidTransition:
            assert not allowed
            return
        assert allowed
        job.max_attempts += extra
        assert snapshot.max_attempts == job.max_attempts
        job.requeue(None)
        # Back in its sequence: behind any other open job of it.
        job.held = job.key is not None and any(
            other is not job and other.key == job.key and not other.final
            for other in self.jobs.values()
        )

    # ------------------------------------------------------------------ executor

    @rule(target=tokens, job_id=st.sampled_from(JOB_IDS), worker=st.sampled_from(WORKERS))
    def try_start(self, job_id: str, worker: str) -> MultipleResults[str]:
        job = self.jobs.get(job_id)
        if job is None:
            return multiple()  # (try_start of an unknown job id raises: not a transition)
        claim = execution.try_start(
            scope_hash(SCOPE), job_id, worker, lease_seconds=LEASE, now=self.now
        )
        if not job.due(self.now) or job_id not in self._claimable()[0]:
            assert claim is None
            return multiple()
        assert claim is not None
        self._start(job_id, claim.token, worker)
        assert claim.attempt == job.attempts
        return multiple(claim.token)

    @rule(target=tokens, worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def claim_due(self, worker: str, limit: int) -> MultipleResults[str]:
        due = {job_id for job_id, job in self.jobs.items() if job.due(self.now)}
        claimable, takes = self._claimable()
        claims = execution.claim_due(worker, limit=limit, lease_seconds=LEASE, now=self.now)
        # A limit key holds its jobs once one of them runs: one claim takes one per key.
        counted = [c for c in claims if self.jobs[c.job_id].limit_key and not self._rated(c)]
        assert len({self.jobs[c.job_id].limit_key for c in counted}) == len(counted)
        assert len(claims) == min(limit, takes)
        for claim in claims:
            assert claim.job_id in due
            assert claim.job_id in claimable
            self._start(claim.job_id, claim.token, worker)
            assert claim.attempt == self.jobs[claim.job_id].attempts
        return multiple(*(claim.token for claim in claims))

    @rule(
        token=tokens,
        pick=PICK,
        values=st.lists(st.sampled_from([10.0, 50.0, 90.0]), min_size=1, max_size=3),
    )
    def report_progress(self, token: str, pick: int, values: list[float]) -> None:
        """A handler's reports, one after the other (a lower one is refused)."""
        token = self._pick(token, pick)
        job = self._holder(token)
        for value in values:
            recorded = execution.report_progress(token, value, now=self.now)
            expected = (
                job is not None
                and not job.cancel
                and (job.progress is None or job.progress <= value)
            )
            assert recorded == expected
            if expected:
                assert job is not None
                job.progress = value

    @rule(token=tokens, pick=PICK)
    def complete(self, token: str, pick: int) -> None:
        token = self._pick(token, pick)
        job = self._holder(token)
        outcome = execution.complete(token, now=self.now)
        if job is None:
            assert outcome is FinishOutcome.STALE
            return
        expected = "cancelled" if job.cancel else "succeeded"
        assert outcome.value == expected
        job.end(expected, expected)

    @rule(token=tokens, pick=PICK, retry=st.booleans())
    def fail(self, token: str, pick: int, retry: bool) -> None:
        token = self._pick(token, pick)
        job = self._holder(token)
        retry_at = self.now + timedelta(seconds=30) if retry else None
        outcome = execution.fail(token, "boom", retry_at=retry_at, now=self.now)
        self._ended(job, outcome, "failed", retry_at)

    @rule(token=tokens, pick=PICK)
    def interrupt(self, token: str, pick: int) -> None:
        token = self._pick(token, pick)
        job = self._holder(token)
        outcome = execution.interrupt(token, now=self.now)
        self._ended(job, outcome, "interrupted", None)

    @rule(token=tokens, pick=PICK, requeue=st.booleans())
    def recover(self, token: str, pick: int, requeue: bool) -> None:
        token = self._pick(token, pick)
        job = self._holder(token)
        outcome = execution.recover(token, requeue=requeue, now=self.now)
        self._recovered(job, outcome, requeue)

    @rule(token=tokens, pick=PICK, max_snoozes=st.sampled_from([None, 0, 1, 2]))
    def snooze(self, token: str, pick: int, max_snoozes: int | None) -> None:
        token = self._pick(token, pick)
        job = self._holder(token)
        run_at = self.now + timedelta(seconds=30)
        outcome = execution.snooze(token, run_at, max_snoozes=max_snoozes, now=self.now)
        if job is None:
            assert outcome is FinishOutcome.STALE
        elif job.cancel:
            assert outcome is FinishOutcome.CANCELLED
            job.end("cancelled", "cancelled")
        elif max_snoozes is not None and job.snoozes >= max_snoozes:
            # Past its bound the execution counts: it ends Failed, naming the bound.
            assert outcome is FinishOutcome.FAILED
            job.end("failed", "failed")
        else:
            assert outcome is FinishOutcome.SNOOZED
            job.close("snoozed")
            job.attempts -= 1
            job.snoozes += 1
            job.requeue(run_at)

    @rule(token=tokens, pick=PICK)
    def release(self, token: str, pick: int) -> None:
        token = self._pick(token, pick)
        job = self._holder(token)
        outcome = execution.release(token, "released: model", now=self.now)
        if job is None:
            assert outcome is FinishOutcome.STALE
        elif job.cancel:
            # The job is what was asked; the attempt row ends as a stopped one would.
            assert outcome is FinishOutcome.CANCELLED
            job.end("cancelled", "interrupted")
        else:
            assert outcome is FinishOutcome.RELEASED
            job.close("released")
            job.attempts -= 1
            job.releases += 1
            job.requeue(job.run_at)  # its next_run_at kept: it was due

    @rule(token=tokens, pick=PICK)
    def put_back_unknown_handler(self, token: str, pick: int) -> None:
        token = self._pick(token, pick)
        job = self._holder(token)
        outcome = execution.put_back_unknown_handler(token, "unknown: model", now=self.now)
        if job is None:
            assert outcome is FinishOutcome.STALE
            return
        # The claim is undone: no attempt consumed, its attempt row deleted.
        job.rows = [row for row in job.rows if row.token != token]
        job.attempts -= 1
        job.token, job.leased_by, job.lease_until, job.progress = None, "", None, None
        since = job.unknown_since or self.now
        job.unknown_since = since
        window = jobs_settings().UNKNOWN_HANDLER_RETRY_SECONDS
        delay = min(jobs_settings().UNKNOWN_HANDLER_RETRY_DELAY, window)
        if job.cancel:
            assert outcome is FinishOutcome.CANCELLED
            job.status = "cancelled"
        elif since <= self.now - timedelta(seconds=window):
            assert outcome is FinishOutcome.FAILED
            job.status = "failed"
        else:
            assert outcome is FinishOutcome.PUT_BACK
            job.status = "queued"
            job.run_at = self.now + timedelta(seconds=delay)

    @rule(token=tokens, pick=PICK, worker=st.sampled_from(WORKERS))
    def heartbeat(self, token: str, pick: int, worker: str) -> None:
        token = self._pick(token, pick)
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
            if job.token and job.lease_expired(self.now)
        }
        outcomes = execution.recover_expired(requeue=requeue, now=self.now)
        assert set(outcomes) == set(expired)
        for token, job in expired.items():
            self._recovered(job, outcomes[token], requeue)

    @rule(worker=st.sampled_from(WORKERS))
    def recover_worker(self, worker: str) -> None:
        own = {
            job.token: job for job in self.jobs.values() if job.token and job.leased_by == worker
        }
        outcomes = execution.recover_worker(worker, now=self.now)
        assert set(outcomes) == set(own)
        for token, job in own.items():
            self._recovered(job, outcomes[token], requeue=True)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3), by_lease=st.booleans())
    def worker_dies_mid_job(self, worker: str, limit: int, by_lease: bool) -> None:
        """A worker claims what is due and dies while its handlers run: another worker
        recovers the attempts once their leases expired, or the worker's own restart
        at once — one turn of the crash budget, in one step."""
        self.claim_due(worker, limit)
        if by_lease:
            self.now += timedelta(seconds=LEASE + 1)
            self.recover_expired(requeue=True)
        else:
            self.recover_worker(worker)

    @rule(
        token=tokens,
        pick=PICK,
        worker=st.sampled_from(WORKERS),
        by_owner=st.booleans(),
        requeue=st.booleans(),
    )
    def recover_from_an_old_selection(
        self, token: str, pick: int, worker: str, by_owner: bool, requeue: bool
    ) -> None:
        """A recovery that picked its token earlier: since then the lease may have
        been renewed, or the job claimed by another worker. The recovery's own guard
        decides again: the lease expired before now, or the job still leased by the
        restarted worker."""
        token = self._pick(token, pick)
        job = self._holder(token)
        if by_owner:
            outcome = store.recover(token, requeue=requeue, leased_by=worker, now=self.now)
            allowed = job is not None and job.leased_by == worker
        else:
            outcome = store.recover(
                token, requeue=requeue, lease_expired_before=self.now, now=self.now
            )
            allowed = job is not None and job.lease_expired(self.now)
        self._recovered(job if allowed else None, outcome, requeue)

    # ------------------------------------------------------------------ checks

    def _followed(self) -> None:
        """What the store did in the statement that ended a job: the batch's then once
        every job of it is final, and the next held job of a sequence released once
        none of it is Queued or Running and unheld."""
        if not self.then_submitted and all(self.jobs[job_id].final for job_id in BATCH):
            self.then_submitted = True
        for key in set(KEYS.values()):
            members = [job for _id, job in sorted(self.jobs.items()) if job.key == key]
            if any(not job.final and not job.held for job in members):
                continue
            waiting = [job for job in members if job.held and not job.final]
            if waiting:
                # Submission order: the model's job ids are created in this order.
                first = min(waiting, key=lambda job: self._order(job))
                first.held = False

    def _order(self, job: ModelJob) -> int:
        return next(
            row.id
            for row in Job.objects.filter(scope_hash=scope_hash(SCOPE)).only("id", "job_id")
            if self.jobs.get(row.job_id) is job
        )

    @invariant()
    def the_batch_and_the_sequence_match_the_model(self) -> None:
        self._followed()
        batch = JobScope(SCOPE).batch("batch")
        assert batch is not None
        members = [self.jobs[job_id] for job_id in BATCH]
        buckets = ["failed" if job.status == "interrupted" else job.status for job in members]
        pending = sum(not job.final for job in members)
        assert (
            batch.pending,
            batch.succeeded,
            batch.failed,
            batch.cancelled,
            batch.expired,
        ) == (
            pending,
            buckets.count("succeeded"),
            buckets.count("failed"),
            buckets.count("cancelled"),
            buckets.count("expired"),
        ), members
        assert (batch.finished_at is None) == bool(pending)
        then = Job.objects.filter(scope_hash=scope_hash(SCOPE), job_id="batch:then").count()
        assert then == int(self.then_submitted)
        held = set(
            Job.objects.filter(
                scope_hash=scope_hash(SCOPE), sequence_held=True, status="queued"
            ).values_list("job_id", flat=True)
        )
        assert held == {
            job_id for job_id, job in self.jobs.items() if job.held and job.status == "queued"
        }
        keyed = [job for job in self.jobs.values() if job.key == "s"]
        if keyed:
            sequence = Sequence.objects.get(scope_hash=scope_hash(SCOPE), sequence_key="s")
            assert sequence.open == sum(not job.final for job in keyed)

    @invariant()
    def the_store_matches_the_model(self) -> None:
        self._followed()
        rows = {
            job.job_id: job
            for job in Job.objects.filter(scope_hash=scope_hash(SCOPE))
            .exclude(job_id="batch:then")
            .prefetch_related("attempts")
        }
        assert set(rows) == set(self.jobs)
        for job_id, model in self.jobs.items():
            row = rows[job_id]
            where = f"job {job_id}: {model}"
            assert row.status == model.status, where
            assert row.attempt_count == model.attempts, where
            assert row.max_attempts == model.max_attempts, where
            assert (row.snooze_count, row.release_count) == (model.snoozes, model.releases), where
            assert row.interruption_count == model.interruptions, where
            assert row.keeps_killing_worker == model.kills_its_worker, where
            assert row.cancel_requested == model.cancel, where
            assert row.current_token == model.token, where
            assert (row.leased_by, row.lease_expires_at) == (model.leased_by, model.lease_until), (
                where
            )
            assert row.handler_unknown_since == model.unknown_since, where
            assert row.start_by == model.start_by, where
            if model.debounced is not None:
                assert json.loads(row.payload_json) == model.debounced, where
            if model.status == "running":
                assert row.progress == model.progress, where
            if model.status == "queued" and model.run_at is not None:
                assert row.next_run_at == model.run_at, where
            attempts = sorted(row.attempts.all(), key=lambda a: a.number)
            assert [(a.number, a.token, a.status) for a in attempts] == [
                (a.number, a.token, a.status) for a in model.rows
            ], where
            # One row per execution: counted, snoozed, released or interrupted within the
            # crash budget (a put-back deletes its row).
            executions = row.attempt_count + row.snooze_count + row.release_count
            assert len(attempts) == executions + row.interruption_count, where
        # Each rated key's bucket is where its starts put it.
        rows = RateBucket.objects.filter(key__startswith="handler:")
        buckets = {bucket.key: bucket.tat for bucket in rows}
        assert buckets == {
            f"handler:{RATED}#{key}": nanoseconds(tat) for key, tat in self.tats.items()
        }

    # ------------------------------------------------------------------ helpers

    def _claimable(self) -> tuple[set[str], int]:
        """The due jobs a claim may take — those without a limit key, the jobs of each
        counted key with no Running job, and the rated jobs of each key whose bucket
        has room —, and how many one claim takes at most: one per such counted key, as
        many as its room per rated key."""
        busy = {
            job.limit_key for job in self.jobs.values() if job.status == "running" and not job.rated
        }
        free: set[str] = set()
        by_key: dict[str, set[str]] = {}
        by_rate: dict[str, set[str]] = {}
        for job_id, job in self.jobs.items():
            if not job.due(self.now):
                continue
            if job.rated:
                if self._room(job.limit_key) >= 1:
                    by_rate.setdefault(job.limit_key, set()).add(job_id)
            elif not job.limit_key:
                free.add(job_id)
            elif job.limit_key not in busy:
                by_key.setdefault(job.limit_key, set()).add(job_id)
        keyed = {job_id for jobs in (*by_key.values(), *by_rate.values()) for job_id in jobs}
        rated = sum(min(self._room(key), len(jobs)) for key, jobs in by_rate.items())
        return free | keyed, len(free) + len(by_key) + rated

    def _room(self, key: str) -> int:
        """The starts the bucket of rated ``key`` lets through now."""
        ahead = max(self.tats.get(key, self.now), self.now)
        return (self.now + RATE_BURST * RATE_INTERVAL - ahead) // RATE_INTERVAL

    def _rated(self, claim: Claim) -> bool:
        return self.jobs[claim.job_id].rated

    def _start(self, job_id: str, token: str, worker: str) -> None:
        """``job_id`` starts under ``token``: a rated one takes a start from its bucket."""
        job = self.jobs[job_id]
        job.start(token, worker, self.now)
        if job.rated:
            ahead = max(self.tats.get(job.limit_key, self.now), self.now)
            self.tats[job.limit_key] = ahead + RATE_INTERVAL

    def _pick(self, token: str, pick: int) -> str:
        """The token a rule uses: the one drawn from the bundle (``pick`` 0: most of
        them are stale after a few steps), or the current token of a Running job."""
        running = self._running(pick)
        if running is None or running[1].token is None:
            return token
        return running[1].token

    def _running(self, pick: int) -> tuple[str, ModelJob] | None:
        """The Running job (its id and model) that ``pick`` 1 and up chooses; None for
        ``pick`` 0 or when no job runs."""
        # By job id: tokens are random, and a replayed example must pick the same job.
        running = [(job_id, job) for job_id, job in sorted(self.jobs.items()) if job.token]
        if not pick or not running:
            return None
        return running[(pick - 1) % len(running)]

    def _holder(self, token: str) -> ModelJob | None:
        """The job whose current, Running attempt ``token`` is (None: stale)."""
        for job in self.jobs.values():
            if job.holds(token):
                return job
        return None

    def _recovered(self, job: ModelJob | None, outcome: FinishOutcome, requeue: bool) -> None:
        """A recovery: with ``requeue``, the crash budget — the attempt ends Interrupted
        without counting, and the job is Queued again at once while its interruptions
        stay below the budget, or ends Interrupted, keeping killing its worker, at it;
        without, an interrupt. A cancel request that came first ends it Cancelled."""
        if job is None or job.cancel or not requeue:
            self._ended(job, outcome, "interrupted", None)
            return
        job.close("interrupted")
        job.attempts -= 1
        job.interruptions += 1
        if job.interruptions < self.max_interruptions:
            assert outcome is FinishOutcome.REQUEUED
            job.requeue(self.now)
            return
        assert outcome is FinishOutcome.KEEPS_KILLING_WORKER
        job.status = "interrupted"
        job.kills_its_worker = True

    def _ended(
        self,
        job: ModelJob | None,
        outcome: FinishOutcome,
        status: str,
        requeue_at: datetime | None,
    ) -> None:
        """A finish: ``status`` for the job and its attempt unless a cancel request
        came first (an interrupted attempt stays interrupted), re-queued at
        ``requeue_at`` while attempts are left."""
        if job is None:
            assert outcome is FinishOutcome.STALE
            return
        if job.cancel:
            assert outcome is FinishOutcome.CANCELLED
            job.end("cancelled", "interrupted" if status == "interrupted" else "cancelled")
            return
        job.end(status, status)
        if requeue_at is not None and job.attempts < job.max_attempts:
            assert outcome is FinishOutcome.REQUEUED
            job.requeue(requeue_at)
            return
        assert outcome.value == status


@pytest.fixture(autouse=True)
def keyed_handler(handler):
    handler(KEYED, max_running_per_key=1)(lambda ctx: None)
    handler(RATED, rate_per_key=(1, RATE_INTERVAL.total_seconds(), RATE_BURST))(lambda ctx: None)


def test_the_jobs_store_follows_its_model(handler: Any) -> None:
    handler("test.then")(lambda ctx: None)
    run_state_machine_as_test(
        JobsStoreModel,
        settings=settings(
            max_examples=EXAMPLES or SHORT[connection.vendor],
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
