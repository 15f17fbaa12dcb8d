"""Tasks the tests enqueue to observe the backend from outside the worker process.

Each one leaves a trace the test can read (a ``TaskEvent`` row, its return value or
its error); none sleeps to create an ordering.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from django.db import transaction

from jobs.backends import JobsTaskContext
from jobs.backends.compat import TaskContext, task
from jobs.handlers import RetryPolicy

from .models import TaskEvent

#: Retry at once: tests should not wait for a backoff.
NO_DELAY = RetryPolicy(base_delay=0, jitter=0)


class ShippingError(Exception):
    """The error the failing task raises (its class path must reach TaskResult.errors)."""


def _event(kind: str, detail: str = "", result_id: str = "", attempt: int = 0) -> None:
    with transaction.atomic():
        TaskEvent.objects.create(kind=kind, detail=detail, result_id=result_id, attempt=attempt)


@task
def record(label: str) -> str:
    """Write a ``ran`` event (its row id gives the order tasks ran in)."""
    _event("ran", label)
    return label


@task
def ship(order: int) -> None:
    raise ShippingError(f"no courier for order {order}")


@task(takes_context=True, max_attempts=3, retry=NO_DELAY)  # type: ignore[call-overload, untyped-decorator]
def flaky(context: TaskContext[Any, Any], fail_times: int) -> int:
    """Fail on the first ``fail_times`` attempts, then return the attempt number."""
    _event("ran", "flaky", context.task_result.id, context.attempt)
    if context.attempt <= fail_times:
        raise ConnectionError(f"outage on attempt {context.attempt}")
    return context.attempt


@task(max_attempts=2, retry=RetryPolicy(base_delay=3600, jitter=0))  # type: ignore[call-overload, untyped-decorator]
def retried_in_an_hour() -> None:
    raise ConnectionError("try again later")


@task
async def async_double(n: int) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"double": n * 2, "async": True}


@task(takes_context=True)
def introspect(context: TaskContext[Any, Any], tag: str) -> dict[str, Any]:
    """Return what the task saw of its context."""
    assert isinstance(context, JobsTaskContext)
    return {
        "tag": tag,
        "attempt": context.attempt,
        "id": context.task_result.id,
        "status": context.task_result.status,
        "worker_ids": context.task_result.worker_ids,
        "job_id": context.job.job_id,
    }


@task(takes_context=True)
def until_cancelled(context: TaskContext[Any, Any], started_file: str) -> str:
    """Report progress until cancellation reaches the task, then stop cooperatively."""
    assert isinstance(context, JobsTaskContext)
    Path(started_file).touch()
    done = 0
    while not context.job.wait_for_cancel(0.05):
        done = min(done + 1, 99)
        context.job.report_progress(done, "working")
    context.job.raise_if_cancelled()
    return "unreachable"


@task
def exits() -> None:
    raise SystemExit(3)


@task
def returns_object() -> object:
    return object()


@task(takes_context=True, max_attempts=2, retry=NO_DELAY)  # type: ignore[call-overload, untyped-decorator]
def hold(context: TaskContext[Any, Any], release_file: str, started_file: str) -> int:
    """Run until ``release_file`` exists (tests keep the task RUNNING as long as they
    need, without sleeping); ``started_file`` is touched when each attempt starts."""
    assert isinstance(context, JobsTaskContext)
    Path(f"{started_file}.{context.attempt}").touch()
    while not Path(release_file).exists():
        if context.job.wait_for_cancel(0.05):
            context.job.raise_if_cancelled()
    return context.attempt
