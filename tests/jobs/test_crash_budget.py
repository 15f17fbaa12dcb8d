"""The crash budget: an attempt recovered because its worker died (its lease expired,
or the worker restarted) or outlived its shutdown's grace uses none of the job's
``max_attempts`` — the job is queued again at once — while the job has been
interrupted fewer than ``JOBS["MAX_INTERRUPTIONS"]`` times; the interruption that
reaches it ends the job Interrupted as one that keeps killing its worker, named in the
log, the admin and a signal. Every other rule stays: token fencing, the attempt row,
cancel requests, releases, failures, operator retries. On SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs import JobScope, JobStatus, JobSubmission, execution, submit_job
from jobs.conf import jobs_settings
from jobs.exceptions import JobsConfigurationError, JobTimedOut
from jobs.models import Job
from jobs.signals import job_keeps_killing_worker
from jobs.types import AttemptStatus, FinishOutcome, JobSnapshot

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "crash-budget"
LEASE = 30


def scope() -> JobScope:
    return JobScope(SCOPE)


def snapshot(job_id: str) -> JobSnapshot:
    snap = scope().get(job_id)
    assert snap is not None
    return snap


class Runs:
    """One job, claimed by a worker and recovered as each way of recovery does it,
    on a clock of its own (so that leases expire without waiting)."""

    def __init__(self, job_id: str = "j", **options: Any) -> None:
        self.job_id = job_id
        submit_job(SCOPE, job_id, JobSubmission.create("crash.h", **options))
        self.now = timezone.now()

    def claim(self, worker: str = "w1") -> str:
        """Claim the job (it must be due); its token."""
        claim = execution.try_start(
            scope().scope_hash, self.job_id, worker, lease_seconds=LEASE, now=self.now
        )
        assert claim is not None, f"{self.job_id} could not be claimed"
        return claim.token

    def lease_expires(self, token: str) -> FinishOutcome:
        """Another worker's sweep, once the lease expired."""
        self.now += timedelta(seconds=LEASE + 1)
        return execution.recover_expired(now=self.now)[token]

    def worker_restarts(self, token: str) -> FinishOutcome:
        """The worker restarted under its id takes its attempts back at once."""
        self.now += timedelta(seconds=1)
        return execution.recover_worker("w1", now=self.now)[token]

    def shutdown_outlived(self, token: str) -> FinishOutcome:
        """The worker's shutdown, for a handler still running after the grace."""
        self.now += timedelta(seconds=1)
        return execution.recover(
            token, reason="worker shut down before the handler stopped", now=self.now
        )


RECOVERIES: dict[str, Callable[[Runs, str], FinishOutcome]] = {
    "lease-expired": Runs.lease_expires,
    "worker-restarted": Runs.worker_restarts,
    "shutdown-outlived": Runs.shutdown_outlived,
}


@pytest.mark.parametrize("recovery", RECOVERIES.values(), ids=RECOVERIES.keys())
def test_an_interrupted_attempt_uses_none_of_the_jobs_attempts(recovery):
    """Under the defaults (one attempt): the job is Queued again at once, its attempt
    unused and its interruption counted; the next run is attempt 1 again, with an
    attempt row of its own, and succeeds."""
    runs = Runs()
    token = runs.claim()
    assert recovery(runs, token) is FinishOutcome.REQUEUED
    snap = snapshot("j")
    assert (snap.status, snap.attempt_count, snap.max_attempts) == (JobStatus.QUEUED, 0, 1)
    assert (snap.interruption_count, snap.keeps_killing_worker) == (1, False)
    assert snap.next_run_at == runs.now
    [attempt] = snap.attempts
    assert (attempt.number, attempt.status) == (1, AttemptStatus.INTERRUPTED)
    assert snap.error == attempt.error  # why it was queued again

    again = execution.try_start(scope().scope_hash, "j", "w2", now=runs.now)
    assert again is not None
    assert again.attempt == 1
    assert execution.complete(again.token, "done", now=runs.now) is FinishOutcome.SUCCEEDED
    snap = snapshot("j")
    assert (snap.status, snap.attempt_count, snap.interruption_count) == (
        JobStatus.SUCCEEDED,
        1,
        1,
    )
    assert [(a.number, a.status) for a in snap.attempts] == [
        (1, AttemptStatus.INTERRUPTED),
        (2, AttemptStatus.SUCCEEDED),
    ]


@pytest.mark.parametrize("recovery", RECOVERIES.values(), ids=RECOVERIES.keys())
def test_the_third_interruption_ends_the_job_as_one_that_keeps_killing_its_worker(recovery):
    """With the default budget the job runs three times; the third recovery ends it
    Interrupted, not queued again, its error and its flag saying why."""
    runs = Runs(max_attempts=2)
    outcomes = [recovery(runs, runs.claim()) for _ in range(3)]
    assert outcomes == [
        FinishOutcome.REQUEUED,
        FinishOutcome.REQUEUED,
        FinishOutcome.KEEPS_KILLING_WORKER,
    ]
    snap = snapshot("j")
    assert snap.status == JobStatus.INTERRUPTED
    assert (snap.keeps_killing_worker, snap.interruption_count) == (True, 3)
    # Its attempts are untouched: 0 of 2 used.
    assert (snap.attempt_count, snap.max_attempts) == (0, 2)
    assert snap.error.startswith("keeps killing its worker: interrupted 3 times or more")
    assert [(a.number, a.status) for a in snap.attempts] == [
        (n, AttemptStatus.INTERRUPTED) for n in (1, 2, 3)
    ]
    assert snap.finished_at == runs.now
    assert execution.get_due(now=runs.now) == []
    assert execution.claim_due("w2", limit=5, now=runs.now) == []


@pytest.mark.parametrize("budget", [1, 5])
def test_the_budget_is_the_setting(settings, budget):
    settings.JOBS = {**settings.JOBS, "MAX_INTERRUPTIONS": budget}
    runs = Runs()
    outcomes = [runs.lease_expires(runs.claim()) for _ in range(budget)]
    assert outcomes == [FinishOutcome.REQUEUED] * (budget - 1) + [
        FinishOutcome.KEEPS_KILLING_WORKER
    ]
    snap = snapshot("j")
    assert (snap.status, snap.interruption_count) == (JobStatus.INTERRUPTED, budget)


@pytest.mark.parametrize(
    "value", [0, -1, 1001, 2.5, "3", True, None], ids=lambda v: f"{type(v).__name__}-{v}"
)
def test_a_bad_budget_is_a_configuration_error(settings, value):
    settings.JOBS = {**settings.JOBS, "MAX_INTERRUPTIONS": value}
    with pytest.raises(JobsConfigurationError, match=r"MAX_INTERRUPTIONS.*an int from 1 to 1000"):
        jobs_settings()


def test_a_cancel_requested_job_ends_cancelled_and_is_not_counted():
    runs = Runs(max_attempts=3)
    token = runs.claim()
    assert scope().cancel("j").value == "requested"
    assert runs.lease_expires(token) is FinishOutcome.CANCELLED
    snap = snapshot("j")
    assert (snap.status, snap.attempt_count, snap.interruption_count) == (
        JobStatus.CANCELLED,
        1,
        0,
    )
    assert not snap.keeps_killing_worker
    assert [a.status for a in snap.attempts] == [AttemptStatus.INTERRUPTED]
    assert execution.get_due(now=runs.now) == []


@pytest.mark.parametrize(
    "ending",
    [
        pytest.param(
            lambda token, now: execution.fail(
                token, f"{JobTimedOut.__name__}: ran past its timeout", now=now
            ),
            id="timed-out",
        ),
        pytest.param(lambda token, now: execution.interrupt(token, now=now), id="interrupt"),
        pytest.param(
            lambda token, now: execution.recover(token, requeue=False, now=now),
            id="recover-without-requeue",
        ),
        pytest.param(
            lambda token, now: execution.release(token, "released", now=now), id="release"
        ),
        pytest.param(
            lambda token, now: execution.snooze(token, now + timedelta(seconds=1), now=now),
            id="snooze",
        ),
    ],
)
def test_other_endings_are_not_interruptions_of_the_budget(ending):
    """A timeout is a failure, an interrupt and a recovery the caller does not let
    re-queue use their attempt as before, and a release or a snooze gives it back in
    its own count: none of them is an interruption of the crash budget."""
    runs = Runs(max_attempts=2)
    before = snapshot("j")
    outcome = ending(runs.claim(), runs.now)
    assert outcome not in (FinishOutcome.STALE, FinishOutcome.KEEPS_KILLING_WORKER)
    snap = snapshot("j")
    assert (snap.interruption_count, snap.keeps_killing_worker) == (0, False)
    counted = outcome in (FinishOutcome.FAILED, FinishOutcome.INTERRUPTED)
    assert snap.attempt_count == before.attempt_count + counted


def test_an_operator_retry_gives_it_one_more_run():
    """A retry of a job that keeps killing its worker needs no extra attempt (none was
    used), clears the flag and keeps the count: should the next run kill its worker
    too, it ends the same way at once; should it succeed, it succeeds."""
    runs = Runs()
    for _ in range(3):
        runs.lease_expires(runs.claim())
    retried = scope().retry("j")
    assert (retried.status, retried.keeps_killing_worker) == (JobStatus.QUEUED, False)
    assert (retried.interruption_count, retried.attempt_count) == (3, 0)

    assert runs.lease_expires(runs.claim()) is FinishOutcome.KEEPS_KILLING_WORKER
    snap = snapshot("j")
    assert (snap.status, snap.keeps_killing_worker, snap.interruption_count) == (
        JobStatus.INTERRUPTED,
        True,
        4,
    )
    scope().retry("j")
    last = runs.claim()
    assert execution.complete(last, now=runs.now) is FinishOutcome.SUCCEEDED
    snap = snapshot("j")
    assert (snap.status, snap.keeps_killing_worker) == (JobStatus.SUCCEEDED, False)
    assert [a.number for a in snap.attempts] == [1, 2, 3, 4, 5]


def test_the_recovered_attempt_is_fenced_off_by_its_token():
    """Whatever the recovered attempt's handler reports later changes nothing — not
    the Queued job, not the next attempt — and a second recovery of it is stale."""
    runs = Runs()
    old = runs.claim()
    assert runs.lease_expires(old) is FinishOutcome.REQUEUED
    assert execution.complete(old, "late", now=runs.now) is FinishOutcome.STALE
    assert execution.recover(old, now=runs.now) is FinishOutcome.STALE
    new = runs.claim("w2")
    assert not execution.report_progress(old, 50, now=runs.now)
    assert execution.recover(old, now=runs.now) is FinishOutcome.STALE
    snap = snapshot("j")
    assert (snap.status, snap.interruption_count, snap.progress) == (JobStatus.RUNNING, 1, None)
    assert execution.complete(new, "done", now=runs.now) is FinishOutcome.SUCCEEDED


def test_two_workers_recovering_one_attempt_at_once_count_it_once(concurrently):
    """Two workers' sweeps find the same expired lease at the same moment: one
    recovery wins, the other is stale, and the interruption is counted once."""
    runs = Runs()
    token = runs.claim()
    later = runs.now + timedelta(seconds=LEASE + 1)
    results = concurrently(
        lambda: execution.recover(token, now=later), lambda: execution.recover(token, now=later)
    )
    assert sorted(r.value.value for r in results) == ["requeued", "stale"], results
    snap = snapshot("j")
    assert (snap.status, snap.interruption_count, snap.attempt_count) == (JobStatus.QUEUED, 1, 0)
    assert [a.status for a in snap.attempts] == [AttemptStatus.INTERRUPTED]


def test_the_log_and_the_signal_name_the_job_once_its_recovery_committed(caplog):
    received: list[dict[str, Any]] = []

    def receiver(sender: Any, signal: Any, **kwargs: Any) -> None:
        received.append(kwargs)

    job_keeps_killing_worker.connect(receiver, dispatch_uid="test.crash_budget")
    caplog.set_level(logging.ERROR, logger="jobs")
    try:
        runs = Runs(queue="risky")
        for _ in range(2):
            runs.lease_expires(runs.claim())
        token = runs.claim()
        runs.now += timedelta(seconds=LEASE + 1)
        with transaction.atomic():
            assert execution.recover(token, now=runs.now) is FinishOutcome.KEEPS_KILLING_WORKER
            assert received == []  # not before its commit
            assert not caplog.records
    finally:
        job_keeps_killing_worker.disconnect(dispatch_uid="test.crash_budget")
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert "job j keeps killing its worker: interrupted 3 times" in record.getMessage()
    fields = {
        key: getattr(record, key)
        for key in ("job_id", "scope_hash", "handler", "queue", "interruptions")
    }
    expected = {
        "job_id": "j",
        "scope_hash": scope().scope_hash,
        "handler": "crash.h",
        "queue": "risky",
        "interruptions": 3,
    }
    assert fields == expected
    assert record.max_interruptions == 3
    assert record.reason == "recovered: the attempt's worker stopped"
    assert received == [expected]


def test_a_requeue_is_neither_logged_nor_signalled_as_keeping_killing(caplog):
    received: list[Any] = []
    job_keeps_killing_worker.connect(
        lambda sender, **kwargs: received.append(kwargs),
        dispatch_uid="test.crash_budget",
        weak=False,
    )
    caplog.set_level(logging.ERROR, logger="jobs")
    try:
        runs = Runs()
        assert runs.lease_expires(runs.claim()) is FinishOutcome.REQUEUED
    finally:
        job_keeps_killing_worker.disconnect(dispatch_uid="test.crash_budget")
    assert (received, caplog.records) == ([], [])


def _kept_killing(job_id: str) -> None:
    runs = Runs(job_id)
    for _ in range(3):
        runs.lease_expires(runs.claim())


def test_the_admin_names_and_filters_the_jobs_that_keep_killing_their_worker(
    admin_client: Client,
):
    _kept_killing("poison")
    Runs("fine")
    changelist = reverse("admin:jobs_job_changelist")

    def listed(**params: str) -> set[str]:
        response = admin_client.get(changelist, params)
        assert response.status_code == 200
        return {job.job_id for job in response.context["cl"].result_list}

    assert listed(keeps_killing_worker__exact="1") == {"poison"}
    assert listed(keeps_killing_worker__exact="0") == {"fine"}
    response = admin_client.get(changelist)
    assert "keeps killing its worker" in response.text  # the filter's title
    page = admin_client.get(
        reverse("admin:jobs_job_change", args=[Job.objects.get(job_id="poison").pk])
    )
    assert "Interrupted (keeps killing its worker)" in page.text
    assert "0/1 (+3 interrupted)" in page.text
