"""The library's own jobs (schedules, the django.tasks backend) live in reserved
scopes hashed in a namespace of their own: ``JobScope(name)`` is the tenant ``name``
and can never read, cancel, retry or pre-empt them; trusted code reaches them with
``execution.reserved_scope(name)``."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest

from jobs import JobScope, JobStatus, JobSubmission, execution, periodic, submit_job
from jobs.exceptions import InvalidScope, JobNotFound
from jobs.models import Job
from tests.support.schedules import T0, schedules  # noqa: F401  (fixture)

PERIOD_JOB = "hourly@2026-12-01T01:00:00Z"


def test_tenant_scopes_hash_as_before_and_reserved_ones_elsewhere() -> None:
    assert JobScope("periodic").scope_hash == hashlib.sha256(b"periodic").hexdigest()
    reserved = execution.reserved_scope("periodic")
    assert reserved.scope_hash != JobScope("periodic").scope_hash
    assert len(reserved.scope_hash) == 64
    assert execution.reserved_scope("periodic").scope_hash == reserved.scope_hash
    # No tenant string, however built, hashes into the reserved namespace: the NUL
    # that separates it is refused in a scope.
    with pytest.raises(InvalidScope):
        JobScope("ledon\x00reserved-scope\x00periodic")


@pytest.mark.parametrize("name", ["", "a\x00b", "x\ud800", 7])
def test_a_bad_reserved_name_is_typed(name) -> None:
    with pytest.raises(InvalidScope):
        execution.reserved_scope(name)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("schedules")
def test_the_tenant_named_like_the_schedule_scope_cannot_reach_period_jobs() -> None:
    periodic("0 * * * *", name="hourly", handler="reports.hourly")
    execution.enqueue_due_schedules(now=T0 + timedelta(minutes=10))
    [job] = execution.enqueue_due_schedules(now=T0 + timedelta(hours=1))
    assert job.job_id == PERIOD_JOB

    tenant = JobScope("periodic")
    assert tenant.get(PERIOD_JOB) is None
    assert tenant.list() == []
    with pytest.raises(JobNotFound):
        tenant.cancel(PERIOD_JOB)
    with pytest.raises(JobNotFound):
        tenant.retry(PERIOD_JOB, extra_attempts=1)
    # The tenant taking the period's id first cannot pre-empt the next period either:
    # its job is its own, and the schedule's job of that period is created beside it.
    submit_job("periodic", "hourly@2026-12-01T02:00:00Z", JobSubmission.create("evil.handler"))
    [next_job] = execution.enqueue_due_schedules(now=T0 + timedelta(hours=2))
    assert next_job.handler == "reports.hourly"

    reserved = execution.reserved_scope("periodic")
    assert reserved.get(PERIOD_JOB).status == JobStatus.QUEUED
    assert Job.objects.filter(job_id="hourly@2026-12-01T02:00:00Z").count() == 2
