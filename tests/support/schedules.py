"""Helpers for the schedule tests: an isolated registry of schedules and handlers,
and a time base for injected clocks."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from jobs import execution, handlers
from jobs.models import Job
from jobs.schedules import declarations
from jobs.schedules.models import Schedule

#: A Tuesday, 00:00 UTC, in a month without a DST change.
T0 = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
def schedules() -> Iterator[None]:
    """No schedule declared but the test's own; handlers registered by the test are
    removed after it. The apps' task modules are imported first (as a worker, the
    admin and list_schedules do), so that their handlers count as already there."""
    handlers.autodiscover()
    before = {(spec.name, spec.version) for spec in handlers.registered_handlers()}
    with declarations.isolated():
        yield
    for spec in handlers.registered_handlers():
        if (spec.name, spec.version) not in before:
            handlers.unregister(spec.name, spec.version)


def period_jobs(name: str | None = None) -> list[str]:
    """The ids of the period jobs (scope "periodic"), oldest period first."""
    jobs = Job.objects.for_scope(execution.reserved_scope("periodic").scope_hash)
    if name is not None:
        jobs = jobs.filter(job_id__startswith=f"{name}@")
    return list(jobs.order_by("next_run_at", "job_id").values_list("job_id", flat=True))


def row(name: str) -> Schedule:
    return Schedule.objects.get(name=name)
