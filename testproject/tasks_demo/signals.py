"""Receivers that record Django's task signals as ``TaskEvent`` rows, in whichever
process sends them (the web process for ``task_enqueued``, the worker for the rest)."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from jobs.backends.compat import TaskResult, task_enqueued, task_finished, task_started

from .models import TaskEvent


def _record(kind: str, task_result: TaskResult[Any, Any]) -> None:
    TaskEvent.objects.create(
        kind=kind,
        result_id=task_result.id,
        status=task_result.status,
        attempt=task_result.attempts,
        detail=task_result.task.module_path,
    )


@receiver(task_enqueued)
def record_enqueued(sender: type[Any], task_result: TaskResult[Any, Any], **kwargs: Any) -> None:
    _record("task_enqueued", task_result)


@receiver(task_started)
def record_started(sender: type[Any], task_result: TaskResult[Any, Any], **kwargs: Any) -> None:
    _record("task_started", task_result)


@receiver(task_finished)
def record_finished(sender: type[Any], task_result: TaskResult[Any, Any], **kwargs: Any) -> None:
    _record("task_finished", task_result)
