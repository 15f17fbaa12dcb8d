"""System checks for the sagas app (ids ``sagas.E0xx``)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks

from ledon.checks import (
    ENGINES,
    check_metrics_token,
    check_round_trip_deadline,
    check_sqlite_options,
)

from .conf import sagas_settings


@checks.register(ENGINES)
def check_sagas_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return sagas_settings.check("sagas.E001")


@checks.register(ENGINES)
def check_outbox_installed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if apps.is_installed("outbox"):
        return []
    return [
        checks.Error(
            "the sagas app needs the outbox app: each step runs in its own unit of work",
            hint="Add 'outbox' to INSTALLED_APPS.",
            id="sagas.E002",
        )
    ]


# The same function from every app: the check framework runs it once.
checks.register(check_sqlite_options, ENGINES)
checks.register(check_metrics_token, ENGINES)
checks.register(check_round_trip_deadline, ENGINES)
