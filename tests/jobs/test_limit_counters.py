"""The limit counters a claim under limits reads on PostgreSQL: every way a job leaves
Running gives its counts back in the same transaction — finish in each outcome,
inside the claim's own statement, recovery, snooze, put-back, a cancel —, per-scope
counters count per scope, a claim rolled back counts nothing, and a worker process
killed with SIGKILL leaves counts that recovery gives back. After each step the
counters equal the Running jobs' ``limit_keys``, recounted from the jobs table.

SQLite writes no counters (its claims hold the write lock and count Running jobs):
the last test says so."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs import JobScope, JobStatus, JobSubmission, execution, submit_job
from jobs.models import Job, LimitCounter
from jobs.types import FinishOutcome
from tests.conftest import in_own_connection
from tests.support.procs import WorkerProcess, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "counters"
postgres_only = pytest.mark.postgres_only


def submit(n: int, handler: str, *, prefix: str = "j", scope: str = SCOPE, **kwargs) -> None:
    for i in range(n):
        submit_job(scope, f"{prefix}{i}", JobSubmission.create(handler, {"n": i}, **kwargs))


def counters() -> dict[str, int]:
    """The counters that count something."""
    return {c.key: c.running for c in LimitCounter.objects.all() if c.running}


def recounted() -> dict[str, int]:
    """What the counters should say: the Running jobs' ``limit_keys``."""
    counts: Counter[str] = Counter()
    for keys in Job.objects.filter(status=JobStatus.RUNNING).values_list("limit_keys", flat=True):
        counts.update(json.loads(keys) if keys else [])
    return dict(counts)


def assert_exact() -> dict[str, int]:
    # A job Queued again counts nowhere: a claim without limits would keep its keys.
    assert not Job.objects.filter(status=JobStatus.QUEUED).exclude(limit_keys=None).exists()
    found = counters()
    assert found == recounted()
    return found


@postgres_only
def test_a_claim_counts_and_every_finish_gives_the_count_back(handler):
    handler("count.capped", max_running=10)(lambda ctx: None)
    submit(6, "count.capped", max_attempts=2)
    claims = execution.claim_due("w", limit=6)
    assert len(claims) == 6
    assert assert_exact() == {"handler:count.capped": 6}
    a, b, c, d, e, f = claims
    assert execution.complete(a.token, None) is FinishOutcome.SUCCEEDED
    assert execution.fail(b.token, "boom") is FinishOutcome.FAILED
    retry_at = timezone.now() + timedelta(hours=1)
    assert execution.fail(c.token, "again", retry_at=retry_at) is FinishOutcome.REQUEUED
    assert execution.interrupt(d.token) is FinishOutcome.INTERRUPTED
    assert assert_exact() == {"handler:count.capped": 2}
    # A stale finish gives nothing back.
    assert execution.complete(a.token, None) is FinishOutcome.STALE
    outcomes, more = execution.complete_and_claim([(e, None), (f, None)], "w", limit=5)
    assert set(outcomes.values()) == {FinishOutcome.SUCCEEDED}
    assert more == []  # the rest is not due or has no attempts left
    assert assert_exact() == {}


@postgres_only
def test_the_claims_own_finish_nets_its_counts_into_one_change_per_counter(handler):
    handler("count.one", max_running=1)(lambda ctx: None)
    submit(3, "count.one")
    [first] = execution.claim_due("w", limit=3)
    _, [second] = execution.complete_and_claim([(first, None)], "w", limit=3)
    assert assert_exact() == {"handler:count.one": 1}
    _, [third] = execution.complete_and_claim([(second, None)], "w", limit=3)
    assert execution.complete(third.token, None) is FinishOutcome.SUCCEEDED
    assert assert_exact() == {}


@postgres_only
def test_a_release_at_shutdown_gives_its_count_back(handler):
    handler("count.released", max_running=10)(lambda ctx: None)
    submit(2, "count.released")
    first, second = execution.claim_due("w", limit=2)
    assert assert_exact() == {"handler:count.released": 2}
    assert execution.release(first.token, "stopped by the worker's shutdown") is (
        FinishOutcome.RELEASED
    )
    assert assert_exact() == {"handler:count.released": 1}
    # A stale token gives nothing back twice.
    assert execution.release(first.token, "again") is FinishOutcome.STALE
    assert assert_exact() == {"handler:count.released": 1}
    assert execution.release(second.token, "stopped by the worker's shutdown") is (
        FinishOutcome.RELEASED
    )
    assert assert_exact() == {}


@postgres_only
def test_recovery_snooze_put_back_and_cancel_give_counts_back(handler):
    handler("count.many", max_running=10)(lambda ctx: None)
    submit(5, "count.many", max_attempts=3)
    claims = execution.claim_due("w", limit=5, lease_seconds=1)
    assert assert_exact() == {"handler:count.many": 5}
    later = timezone.now() + timedelta(seconds=30)
    # All five leases expired together: recovery may take any one of them.
    recovered = execution.recover_expired(now=later, limit=1)
    assert list(recovered.values()) == [FinishOutcome.REQUEUED]
    b, c, d, e = [claim for claim in claims if claim.token not in recovered]
    assert execution.snooze(b.token, later) is FinishOutcome.SNOOZED
    assert execution.put_back_unknown_handler(c.token, "unknown") is FinishOutcome.PUT_BACK
    JobScope(SCOPE).cancel(d.job_id)
    assert execution.complete(d.token, None) is FinishOutcome.CANCELLED
    assert assert_exact() == {"handler:count.many": 1}
    assert execution.recover_worker("w") == {e.token: FinishOutcome.REQUEUED}
    assert assert_exact() == {}


@postgres_only
def test_per_scope_counters_count_each_scope_and_the_name(handler):
    handler("count.tenant", max_running=10, max_running_per_scope=2)(lambda ctx: None)
    for tenant in ("t1", "t2"):
        submit(3, "count.tenant", prefix=tenant, scope=tenant)
    claims = execution.claim_due("w", limit=10)
    assert len(claims) == 4  # two per scope
    found = assert_exact()
    assert found.pop("handler:count.tenant") == 4
    assert sorted(found.values()) == [2, 2]
    assert all(key.startswith("handler:count.tenant:") for key in found)
    for claim in claims:
        execution.complete(claim.token, None)
    assert assert_exact() == {}


@postgres_only
def test_a_claim_rolled_back_counts_nothing(handler):
    handler("count.rolled", max_running=3)(lambda ctx: None)
    submit(3, "count.rolled")

    class Abandon(Exception):
        pass

    def claim_then_roll_back() -> None:
        try:
            with transaction.atomic():
                assert len(execution.claim_due("w", limit=3)) == 3
                assert counters() == {"handler:count.rolled": 3}
                raise Abandon
        except Abandon:
            pass

    in_own_connection(claim_then_roll_back)()
    assert assert_exact() == {}
    assert len(execution.claim_due("w", limit=3)) == 3
    assert assert_exact() == {"handler:count.rolled": 3}


@postgres_only
@pytest.mark.slow
def test_a_worker_killed_mid_attempt_leaves_counts_that_recovery_gives_back(tmp_path: Path):
    """A real ``run_jobs`` process with flow.limited (max_running=2) running two long
    attempts is killed with SIGKILL: its claims committed, so the counter says 2, as
    the Running jobs do; recovering the dead worker's attempts (re-queued) gives both
    back, and a
    new worker runs every job under the limit."""
    for n in range(4):
        submit_job(
            SCOPE, f"k{n}", JobSubmission.create("flow.limited", {"seconds": 30}, max_attempts=2)
        )
    env = {"FLOW_TASKS": "1", "JOBS_POLL_INTERVAL": "0.05", "JOBS_SCHEDULER": "false"}
    proc = WorkerProcess(tmp_path, "--concurrency", "4", env=env)
    try:
        wait_until(
            lambda: Job.objects.filter(status=JobStatus.RUNNING).count() == 2,
            60,
            "two attempts Running",
            proc,
        )
        proc.kill()
    finally:
        proc.close()
    assert assert_exact() == {"handler:flow.limited": 2}
    [worker_id] = set(
        Job.objects.filter(status=JobStatus.RUNNING).values_list("leased_by", flat=True)
    )
    outcomes = execution.recover_worker(worker_id)
    assert list(outcomes.values()) == [FinishOutcome.REQUEUED] * 2
    assert assert_exact() == {}
    # Every job runs at once now.
    Job.objects.filter(handler="flow.limited").update(payload_json='{"seconds": 0}')
    second = WorkerProcess(tmp_path, "--concurrency", "4", env=env)
    try:
        wait_until(
            lambda: not Job.objects.exclude(status=JobStatus.SUCCEEDED).exists(),
            60,
            "every job to succeed",
            second,
        )
    finally:
        second.close()
    assert assert_exact() == {}


def test_sqlite_claims_write_no_counters(handler):
    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL keeps counters (the tests above)")
    handler("count.sqlite", max_running=2, max_running_per_scope=1)(lambda ctx: None)
    submit(3, "count.sqlite")
    assert len(execution.claim_due("w", limit=3)) == 1
    assert not LimitCounter.objects.exists()
    assert not Job.objects.exclude(limit_keys=None).exists()
