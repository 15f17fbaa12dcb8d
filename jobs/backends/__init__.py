"""A backend for Django's tasks framework backed by the job store.

``TASKS = {"default": {"BACKEND": "jobs.backends.JobsBackend"}}`` makes every
``@task`` function enqueue a job that ``manage.py run_jobs`` runs; see
``docs/django-tasks.md``.
"""

from __future__ import annotations

from importlib import import_module

from django.conf import settings

from . import task_handler  # noqa: F401  (registers the job handler that runs tasks)
from .backend import JobsBackend
from .compat import InvalidTaskBackend, task_backends
from .exceptions import InvalidReturnValue, TaskInterrupted, TaskNotRegistered
from .task_registry import JobsTask, JobsTaskContext

__all__ = [
    "InvalidReturnValue",
    "JobsBackend",
    "JobsTask",
    "JobsTaskContext",
    "TaskInterrupted",
    "TaskNotRegistered",
    "autodiscover_tasks",
]


def autodiscover_tasks() -> None:
    """Import the ``OPTIONS["MODULES"]`` of every ``JobsBackend`` in ``TASKS``.

    Called by the worker's autodiscovery (after each app's ``tasks`` module), so that
    every ``@task`` function of these modules is registered before a job asks for it.
    Only module names written in settings are imported, never a path read from a job.
    """
    for alias in getattr(settings, "TASKS", {}):
        try:
            backend = task_backends[alias]
        except InvalidTaskBackend:
            continue  # reported by Django's system checks
        if isinstance(backend, JobsBackend):
            for module in backend.parsed_options.modules:
                import_module(module)
