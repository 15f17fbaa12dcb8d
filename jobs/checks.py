"""System checks for the jobs app (ids ``jobs.E0xx`` and ``jobs.W0xx``; the tasks
backend's are ``jobs.E1xx``)."""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings
from django.core import checks
from django.db import connections

from ledon.checks import (
    ENGINES,
    check_metrics_token,
    check_round_trip_deadline,
    check_sqlite_options,
)
from ledon.conf import settings_hint
from ledon.db import alias_for, is_postgres
from ledon.pglisten import check_listen_database, is_pooled

from .conf import jobs_settings
from .exceptions import JobsConfigurationError
from .middleware import configured_paths, load
from .models import Job
from .tasks_framework import INSTALL_HINT, available


@checks.register(ENGINES)
def check_jobs_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return jobs_settings.check("jobs.E001") or check_middleware()


def check_middleware() -> list[checks.CheckMessage]:
    """``jobs.E003``: every middleware of the chain imports."""
    try:
        load(configured_paths())
    except JobsConfigurationError as exc:
        return [checks.Error(str(exc), hint=settings_hint("JOBS"), id="jobs.E003")]
    return []


@checks.register(ENGINES)
def check_tasks_framework(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``jobs.E108``: ``TASKS`` names the jobs backend but this Django has no tasks
    framework (Django 5.2 without the django-tasks backport)."""
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
checks.register(check_sqlite_options, ENGINES)
checks.register(check_metrics_token, ENGINES)
checks.register(check_round_trip_deadline, ENGINES)


@checks.register(ENGINES)
def check_jobs_behind_a_pooler(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Behind a transaction pooler (a PostgreSQL jobs database with
    ``DISABLE_SERVER_SIDE_CURSORS``): ``jobs.W001``, workers would only poll, their
    LISTEN connection being pooled; ``jobs.E002``, ``JOBS['LISTEN_DATABASE']`` is not
    PostgreSQL; ``jobs.W002``, prepared statements are on (PgBouncer before 1.21
    cannot keep them)."""
    try:
        config = jobs_settings()
    except JobsConfigurationError:
        return []  # reported by check_jobs_settings
    alias = alias_for(Job)
    found = check_listen_database(
        "JOBS['LISTEN_DATABASE']",
        alias,
        config.LISTEN_DATABASE,
        warning_id="jobs.W001",
        error_id="jobs.E002",
    )
    if is_postgres(connections[alias]) and is_pooled(alias) and config.PREPARED_STATEMENTS:
        found.append(
            checks.Warning(
                f"DATABASES[{alias!r}] goes through a transaction pooler "
                "(DISABLE_SERVER_SIDE_CURSORS is set) and JOBS['PREPARED_STATEMENTS'] is "
                "True: a PgBouncer before 1.21 (or without max_prepared_statements) hands "
                "a prepared statement's server connection to other clients, and workers "
                "fail with 'prepared statement ... does not exist'",
                hint="Set JOBS['PREPARED_STATEMENTS'] = False (docs/deployment.md), or "
                "keep it on with PgBouncer >= 1.21 and max_prepared_statements > 0.",
                id="jobs.W002",
            )
        )
    return found


# jobs.E004 lives beside the schedules it checks; importing it registers it.
from .schedules import checks as _schedule_checks  # noqa: E402, F401
