"""The job handler that runs tasks in ``manage.py run_jobs``.

One generic handler (``django.tasks``, version 1) runs every task: it finds the task
in this process's registry by the module path stored in the payload, sends
``task_started``, calls the function (``async def`` functions too, with a
``TaskContext`` when the task takes one), sends ``task_finished`` and returns the
JSON text of the return value as the job's result reference. A failure is re-raised
for the worker, which stores the class path and traceback and, when the task allows
more attempts, schedules a retry with the task's backoff.
"""

from __future__ import annotations

import json
from typing import Any

from django.utils import timezone

from .. import validation
from ..handlers import JobContext, PermanentFailure, get_handler, job_handler
from .backend import JobsBackend
from .compat import TaskResultStatus, normalize_json, task_backends, task_finished, task_started
from .exceptions import InvalidReturnValue, TaskNotRegistered
from .results import (
    HANDLER,
    HANDLER_VERSION,
    TaskPayload,
    TaskRaisedBaseException,
    format_task_error,
    set_return_value,
    task_error,
    update,
)
from .signals import send_signal
from .task_registry import JobsTask, JobsTaskContext


def _backend(alias: str) -> JobsBackend:
    backend = task_backends[alias]
    if not isinstance(backend, JobsBackend):
        raise TaskNotRegistered(
            f"the task was enqueued through TASKS[{alias!r}], which is not a JobsBackend "
            "in this process"
        )
    return backend


def _serialise(value: Any) -> str:
    try:
        text = json.dumps(normalize_json(value), ensure_ascii=False, allow_nan=False)
        validation.text(text, "return value")
    except (TypeError, ValueError) as exc:
        raise InvalidReturnValue(f"the task's return value cannot be stored: {exc}") from exc
    return text


def _will_retry(ctx: JobContext, exc: Exception) -> bool:
    """Whether the worker will queue the task again after ``exc`` (the same test
    the worker applies), so that ``task_finished`` reports READY, not FAILED."""
    if ctx.stopped_by_shutdown:  # the worker releases the claim: queued, uncounted
        return True
    if ctx.attempt >= ctx.max_attempts:
        return False
    if ctx.cancel_requested:
        return False
    policy = ctx.retry_policy or get_handler(HANDLER, HANDLER_VERSION).retry_policy()
    return policy.retry_at(ctx.attempt, timezone.now(), exc) is not None


@job_handler(HANDLER, version=HANDLER_VERSION, format_error=format_task_error)
def run_task(ctx: JobContext) -> str:
    """Run one attempt of a task enqueued through a :class:`JobsBackend`."""
    # Not at the top: this module loads with the tasks backend, which Django may
    # import before the app registry is ready, and the store imports the models.
    from .. import store

    payload = TaskPayload.parse(ctx.payload)
    if payload is None:
        raise PermanentFailure("the job's payload is not a stored task")
    backend = _backend(payload.backend)
    snapshot = store.get(ctx.scope_hash, ctx.job_id)
    if snapshot is None:  # the job row is held by this attempt; it cannot vanish
        raise PermanentFailure(f"job {ctx.job_id!r} disappeared while it ran")
    result = backend.result_for(snapshot)
    task = result.task
    if isinstance(task, JobsTask) and task.retry is not None:
        ctx.retry_policy = task.retry
    sender = type(backend)
    send_signal(task_started, sender, result)
    try:
        if task.takes_context:
            context = JobsTaskContext(task_result=result, job=ctx)
            value = task.call(context, *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        text = _serialise(value)
    except BaseException as exc:
        raised = exc if isinstance(exc, Exception) else TaskRaisedBaseException(repr(exc))
        result.errors.append(task_error(exc))
        if _will_retry(ctx, raised):
            update(result, status=TaskResultStatus.READY)
        else:
            update(result, status=TaskResultStatus.FAILED, finished_at=timezone.now())
        send_signal(task_finished, sender, result)
        if raised is exc:
            raise
        raise raised from exc
    if ctx.stopped_by_shutdown:
        # The worker stores no result for an attempt its shutdown stopped: it gives
        # the claim back (released, its attempt unused), and the task runs again.
        update(result, status=TaskResultStatus.READY)
    else:
        update(result, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
        set_return_value(result, json.loads(text))
    send_signal(task_finished, sender, result)
    return text
