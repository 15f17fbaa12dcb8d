from __future__ import annotations

from datetime import datetime
from importlib import import_module
from typing import TYPE_CHECKING

from django.apps import AppConfig

from .conf import workflows_settings

if TYPE_CHECKING:
    from ledon.dashboard import Panel


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"
    read_settings = workflows_settings

    def ready(self) -> None:
        # The checks import the models, loaded by now.
        import_module("workflows.checks")
        # The jobs that advance runs and purge finished ones are handled in every
        # worker, whatever JOBS["AUTODISCOVER_MODULE"] names.
        import_module("workflows.handlers")

    def dashboard_panels(self, now: datetime) -> list[Panel]:
        """The admin dashboard's panel of runs (read when the dashboard is shown)."""
        from .dashboard import dashboard_panels  # the models are loaded only by now

        return dashboard_panels(now)
