"""System checks for the jobs app (ids ``jobs.E0xx``)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ledon.checks import check_sqlite_options
from ledon.conf import settings_hint

from .conf import jobs_settings, queue_limits
from .exceptions import JobsConfigurationError


@checks.register()
def check_jobs_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    jobs_settings.cache_clear()
    queue_limits.cache_clear()
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


# The same function from every app: the check framework runs it once.
checks.register(check_sqlite_options)
