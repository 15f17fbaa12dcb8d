"""The base of the three apps' configs: what every app does when Django is ready."""

from __future__ import annotations

from importlib import import_module
from typing import Any, ClassVar

from django.apps import AppConfig

from .conf import SettingsReader
from .observability import OptionalLayers


class LedonAppConfig(AppConfig):
    """Registers the app's system checks (``<app>.checks``) and sets up its optional
    metrics and tracing (SPEC M) as ``optional_layers``; an app with dashboard panels
    names the module whose ``dashboard_panels(now)`` gives them."""

    default_auto_field = "django.db.models.BigAutoField"
    #: The reader of the app's settings dict (its error is the app's configuration error).
    read_settings: ClassVar[SettingsReader[Any]]
    #: The module of the app's ``dashboard_panels(now)`` (see :mod:`ledon.dashboard`).
    dashboard_module: ClassVar[str] = ""

    def ready(self) -> None:
        # The checks import the models, loaded by now.
        import_module(f"{self.name}.checks")
        self.optional_layers = OptionalLayers(
            self.name, read_settings=self.read_settings, invalid=self.read_settings.error
        )
        self.optional_layers.configure()

    def dashboard_panels(self, now: Any) -> list[Any]:
        """The admin dashboard's panels of this app (see :mod:`ledon.dashboard`)."""
        if not self.dashboard_module:
            return []
        # The module imports the models, loaded by now.
        panels: list[Any] = import_module(self.dashboard_module).dashboard_panels(now)
        return panels
