"""Django's tasks framework, wherever this Django has it.

Django 6 ships it as ``django.tasks``; for Django 5.2 the same API is the
``django-tasks`` backport (``pip install "django-ledon[tasks-backport]"``), a package
named ``django_tasks`` whose only differences the backend meets are two exception
names (``InvalidTaskError``, ``InvalidTaskBackendError``) and where ``Task`` and
``normalize_json`` live. Django 6.0's ``@task`` takes no options for the backend's
task class (Django 6.1 and the backport do): ``task`` here takes them on all three.
The backend, its tests and the test project import every name of the framework
from here, so one code path serves every version.

Importing this module on Django 5.2 without the backport raises
:class:`~jobs.exceptions.TasksFrameworkMissing`, which says what to install; the
system check ``jobs.E108`` says it before (:mod:`jobs.tasks_framework` finds the
framework without importing it).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import django

from ..exceptions import TasksFrameworkMissing
from ..tasks_framework import BUILT_IN, INSTALL_HINT, PACKAGE, available

if TYPE_CHECKING or BUILT_IN:
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task_backends,
    )
    from django.tasks import task as _framework_task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, DEFAULT_TASK_QUEUE_NAME, TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskException,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
elif not available():
    raise TasksFrameworkMissing(
        f"Django {django.get_version()} has no django.tasks: jobs.backends needs the "
        f"django-tasks backport there. Install it with: {INSTALL_HINT}"
    )
else:
    from django_tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task_backends,
    )
    from django_tasks import task as _framework_task
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import DEFAULT_TASK_PRIORITY, DEFAULT_TASK_QUEUE_NAME, Task, TaskError
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import (
        TaskException,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json


def _passes_task_options(decorator: Any) -> bool:
    """Whether this framework's ``@task`` hands keyword arguments beyond its own to
    the backend's task class (Django 6.1 and the backport do; Django 6.0 does not)."""
    parameters = inspect.signature(decorator).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _task_with_options(
    function: Any = None,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    **options: Any,
) -> Any:
    """Django 6.1's ``@task`` on Django 6.0: the keyword arguments that are not
    Django's (``max_attempts``, ``retry`` of :class:`~jobs.backends.JobsTask`) go to
    the backend's task class, as Django 6.1 passes them."""
    if "run_after" in options:
        raise TypeError(
            "run_after cannot be defined statically with the @task decorator. "
            "Use .using(run_after=...) to set it dynamically."
        )

    def wrapper(func: Any) -> Any:
        return task_backends[backend].task_class(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,
            **options,
        )

    return wrapper(function) if function else wrapper


#: Django's ``@task``; on Django 6.0 it also takes the task class's options, as on
#: Django 6.1 and the backport: ``@task(max_attempts=3, retry=...)`` everywhere.
if TYPE_CHECKING or _passes_task_options(_framework_task):
    task = _framework_task
else:
    task = _task_with_options

__all__ = [
    "BUILT_IN",
    "DEFAULT_TASK_BACKEND_ALIAS",
    "PACKAGE",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskException",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
