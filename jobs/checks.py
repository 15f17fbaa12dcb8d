"""System checks for the jobs app (ids ``jobs.E0xx``)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ledon.checks import check_sqlite_options

from .conf import jobs_settings


@checks.register()
def check_jobs_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return jobs_settings.check("jobs.E001")


# The same function from every app: the check framework runs it once.
checks.register(check_sqlite_options)
