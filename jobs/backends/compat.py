"""Django's tasks framework, wherever this Django has it (SPEC E).

Django 6 ships it as ``django.tasks``; for Django 5.2 the same API is the
``django-tasks`` backport (``pip install "django-ledon[tasks-backport]"``), a package
named ``django_tasks`` whose only differences the backend meets are two exception
names (``InvalidTaskError``, ``InvalidTaskBackendError``) and where ``Task`` and
``normalize_json`` live. The backend, its tests and the test project import every name of the
framework from here, so one code path serves both.

Importing this module on Django 5.2 without the backport raises
:class:`~jobs.exceptions.TasksFrameworkMissing`, which says what to install; the
system check ``jobs.E108`` says it before (:mod:`jobs.tasks_framework` finds the
framework without importing it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
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
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import (
        TaskException,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

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
