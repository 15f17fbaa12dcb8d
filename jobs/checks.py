"""System checks for the jobs app (ids ``jobs.E0xx``; the tasks backend's are
``jobs.E1xx``)."""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings
from django.core import checks

from ledon.checks import check_sqlite_options
from ledon.conf import settings_hint

from .conf import jobs_settings
from .exceptions import JobsConfigurationError


@checks.register()
def check_jobs_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    jobs_settings.cache_clear()
    try:
        jobs_settings()
    except JobsConfigurationError as exc:
        return [
            checks.Error(
                str(exc),
                hint=settings_hint("JOBS"),
                id="jobs.E001",
            )
        ]
    return []


@checks.register()
def check_tasks_framework(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``jobs.E108``: ``TASKS`` names the jobs backend but this Django has no tasks
    framework (Django 5.2 without the django-tasks backport)."""
    from .tasks_framework import INSTALL_HINT, available

    if available():
        return []  # the framework's own check runs the backend's checks
    tasks = getattr(settings, "TASKS", None)
    aliases = [
        alias
        for alias, config in (tasks.items() if isinstance(tasks, dict) else ())
        if isinstance(config, dict) and str(config.get("BACKEND", "")).startswith("jobs.backends")
    ]
    return [
        checks.Error(
            f"TASKS[{alias!r}] uses jobs.backends.JobsBackend, but Django "
            f"{django.get_version()} has no django.tasks and the django-tasks backport "
            "is not installed: nothing would enqueue or run these tasks",
            hint=f"Install the backport: {INSTALL_HINT}",
            id="jobs.E108",
        )
        for alias in aliases
    ]


# The same function from every app: the check framework runs it once.
checks.register(check_sqlite_options)
