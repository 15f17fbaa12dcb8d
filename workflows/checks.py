"""System checks of the workflows app (ids ``workflows.E0xx`` and ``W0xx``)."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import DatabaseError

from jobs.exceptions import JobsConfigurationError
from ledon.checks import ENGINES, check_sqlite_options

from . import registry, store
from .conf import workflows_settings


@checks.register(ENGINES)
def check_workflows_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return workflows_settings.check("workflows.E001")


@checks.register(ENGINES)
def check_versions_in_flight(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Warn about each (name, version) that has runs in flight and no definition in
    this code: those runs wait until a worker with that version runs."""
    try:
        in_flight = store.in_flight_versions()
    except DatabaseError:
        return []  # not migrated yet: nothing can be in flight
    if not in_flight:
        return []
    try:
        # Finding the definitions reads JOBS["AUTODISCOVER_MODULE"]: a bad JOBS
        # setting is jobs.E001's to report, not a traceback here.
        known = {(spec.name, spec.version) for spec in registry.registered_workflows()}
    except JobsConfigurationError:
        return []
    return [
        checks.Warning(
            f"workflow {name!r} version {version} has runs in flight but no definition "
            "in this code",
            hint=(
                "Those runs wait, unfailed, until a worker that defines this version "
                "runs: keep the old version's @workflow beside the new one until they "
                "finish."
            ),
            obj=f"{name} v{version}",
            id="workflows.W001",
        )
        for name, version in in_flight
        if (name, version) not in known
    ]


# The same function from every app: the check framework runs it once.
checks.register(check_sqlite_options, ENGINES)
