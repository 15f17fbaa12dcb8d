"""System checks for the jobs app (ids ``jobs.E0xx``)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ledon.checks import check_sqlite_options
from ledon.conf import settings_hint

from .conf import jobs_settings
from .exceptions import JobsConfigurationError
from .middleware import configured_paths, load


@checks.register()
def check_jobs_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return jobs_settings.check("jobs.E001") or check_middleware()


def check_middleware() -> list[checks.CheckMessage]:
    """``jobs.E002``: every middleware of the chain imports."""
    try:
        load(configured_paths())
    except JobsConfigurationError as exc:
        return [checks.Error(str(exc), hint=settings_hint("JOBS"), id="jobs.E002")]
    return []


# The same function from every app: the check framework runs it once.
checks.register(check_sqlite_options)
