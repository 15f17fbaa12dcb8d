"""How a task is stored as a job, and how a job reads back as a ``TaskResult``.

A task is one job of the generic handler ``django.tasks`` (version 1) whose payload
holds the task's module path (a registry key, never imported), the backend alias and
the arguments. A successful attempt's result reference is the JSON text of the
return value. A failed attempt's error is the exception's class path on the first
line, followed by its traceback, so each ``TaskError`` is read back exactly.
"""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledon.errors import MAX_ERROR_LENGTH, docstring_message, format_error

from ..exceptions import JobCancelled, JobExpired, JobsError
from ..types import AttemptSnapshot, AttemptStatus, JobSnapshot, JobStatus
from .compat import Task, TaskError, TaskResult, TaskResultStatus, normalize_json
from .exceptions import TaskInterrupted

HANDLER = "django.tasks"
HANDLER_VERSION = 1

_STATUS = {
    JobStatus.QUEUED: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
    JobStatus.INTERRUPTED: TaskResultStatus.FAILED,
    JobStatus.EXPIRED: TaskResultStatus.FAILED,
}

# A class path as ``f"{cls.__module__}.{cls.__qualname__}"`` writes it (``<locals>``
# included, as for a class defined inside a function).
_CLASS_PATH = re.compile(r"[A-Za-z_<][\w<>]*(?:\.[A-Za-z_<][\w<>]*)+")


# --------------------------------------------------------------------------- payload


@dataclass(frozen=True, slots=True)
class TaskPayload:
    task_path: str
    backend: str
    args: list[Any]
    kwargs: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {
            "task": self.task_path,
            "backend": self.backend,
            "args": self.args,
            "kwargs": self.kwargs,
        }

    @classmethod
    def build(
        cls, task: Task[..., Any], alias: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskPayload:
        """Arguments normalised as Django does (tuples become lists); anything that
        is not JSON raises ``TypeError`` here, before anything is stored."""
        return cls(
            task.module_path,
            alias,
            [normalize_json(value) for value in args],
            {key: normalize_json(value) for key, value in kwargs.items()},
        )

    @classmethod
    def parse(cls, payload: object) -> TaskPayload | None:
        """The payload of a stored task, or None if the job is not one."""
        if not isinstance(payload, dict):
            return None
        task_path, backend = payload.get("task"), payload.get("backend")
        args, kwargs = payload.get("args"), payload.get("kwargs")
        if not (
            isinstance(task_path, str)
            and isinstance(backend, str)
            and isinstance(args, list)
            and isinstance(kwargs, dict)
        ):
            return None
        return cls(task_path, backend, args, kwargs)


# --------------------------------------------------------------------------- errors


def _class_path(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def task_error(exc: BaseException) -> TaskError:
    """The ``TaskError`` for an exception raised by a task."""
    return TaskError(
        exception_class_path=_class_path(type(exc)),
        traceback="".join(traceback.format_exception(exc)),
    )


def format_task_error(exc: BaseException, limit: int = MAX_ERROR_LENGTH) -> str:
    """The stored error of a failed task attempt: class path, newline, traceback —
    the traceback bounded by the rule of every stored error
    (:func:`ledon.errors.format_error`: the exception's type and message stay)."""
    cause = exc.__cause__ if isinstance(exc, TaskRaisedBaseException) else None
    original = cause if cause is not None else exc
    path = _class_path(type(original))
    return f"{path}\n{format_error(original, limit - len(path) - 1)}"


def parse_task_error(text: str) -> TaskError | None:
    """The ``TaskError`` written by :func:`format_task_error`, or None for other text
    (an error the worker itself recorded, such as an unknown handler)."""
    head, newline, rest = text.partition("\n")
    if not newline or not rest or not _CLASS_PATH.fullmatch(head):
        return None
    return TaskError(exception_class_path=head, traceback=rest)


class TaskRaisedBaseException(Exception):
    """Carries a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``CancelledError``…) out of a task: the worker fails the attempt instead of
    losing its thread. The stored error describes the original (``__cause__``)."""


def _attempt_error(attempt: AttemptSnapshot) -> TaskError | None:
    stored = parse_task_error(attempt.error) if attempt.error else None
    if attempt.status == AttemptStatus.FAILED:
        return stored or TaskError(
            exception_class_path=_class_path(JobsError), traceback=attempt.error
        )
    if attempt.status == AttemptStatus.CANCELLED:
        return stored or TaskError(
            exception_class_path=_class_path(JobCancelled),
            traceback=attempt.error
            or "The task's cancellation was requested while it ran; its result was dropped.",
        )
    if attempt.status == AttemptStatus.INTERRUPTED:
        return TaskError(
            exception_class_path=_class_path(TaskInterrupted),
            traceback=attempt.error or docstring_message(TaskInterrupted),
        )
    return None


def task_errors(snapshot: JobSnapshot) -> list[TaskError]:
    """One ``TaskError`` per attempt that did not succeed, oldest first; a task
    cancelled before its next attempt started gets one saying so."""
    errors = [e for e in map(_attempt_error, snapshot.attempts) if e is not None]
    last = snapshot.attempts[-1] if snapshot.attempts else None
    if snapshot.status == JobStatus.CANCELLED and (
        last is None or last.status != AttemptStatus.CANCELLED
    ):
        errors.append(
            TaskError(
                exception_class_path=_class_path(JobCancelled),
                traceback="The task was cancelled before it ran.",
            )
        )
    if snapshot.status == JobStatus.EXPIRED:
        errors.append(
            TaskError(
                exception_class_path=_class_path(JobExpired),
                traceback="The task was not started by its start deadline.",
            )
        )
    return errors


# --------------------------------------------------------------------------- results


def task_result(
    task: Task[..., Any], snapshot: JobSnapshot, payload: TaskPayload, alias: str
) -> TaskResult[..., Any]:
    """The ``TaskResult`` of a stored task: ``snapshot`` read with its attempts (a job
    just enqueued has none: the task is ready), ``payload`` its parsed payload."""
    status = _STATUS[snapshot.status]
    attempts = snapshot.attempts
    result: TaskResult[..., Any] = TaskResult(
        task=task,
        id=snapshot.job_id,
        status=status,
        enqueued_at=snapshot.created_at,
        started_at=attempts[0].started_at if attempts else None,
        last_attempted_at=attempts[-1].started_at if attempts else None,
        finished_at=(
            snapshot.finished_at
            if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
            else None
        ),
        args=payload.args,
        kwargs=payload.kwargs,
        backend=alias,
        errors=task_errors(snapshot),
        worker_ids=[a.worker_id for a in attempts],
    )
    if status == TaskResultStatus.SUCCESSFUL and snapshot.result_ref is not None:
        set_return_value(result, json.loads(snapshot.result_ref))
    return result


def set_return_value(result: TaskResult[..., Any], value: Any) -> None:
    # TaskResult is frozen; Django's own backends set the value the same way.
    object.__setattr__(result, "_return_value", value)


def update(result: TaskResult[..., Any], **changes: Any) -> None:
    """Change fields of a (frozen) ``TaskResult`` in place, as Django's backends do."""
    for name, value in changes.items():
        object.__setattr__(result, name, value)
