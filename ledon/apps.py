"""The base of the three apps' configs: what every app does when Django is ready."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any, ClassVar

from django.apps import AppConfig

from .observability import ObservedSettings, OptionalLayers


class LedonAppConfig(AppConfig):
    """Registers the app's system checks (``<app>.checks``) and sets up its optional
    metrics and tracing (SPEC M) as ``optional_layers``; an app with dashboard panels
    names the module whose ``dashboard_panels(now)`` gives them."""

    default_auto_field = "django.db.models.BigAutoField"
    #: The app's settings reader and the error of a bad setting, for its optional layers.
    read_settings: ClassVar[Callable[[], ObservedSettings]]
    invalid_settings: ClassVar[type[Exception]]
    #: The module of the app's ``dashboard_panels(now)`` (see :mod:`ledon.dashboard`).
    dashboard_module: ClassVar[str] = ""

    def ready(self) -> None:
        # The checks import the models, loaded by now.
        import_module(f"{self.name}.checks")
        self.optional_layers = OptionalLayers(
            self.name, read_settings=type(self).read_settings, invalid=self.invalid_settings
        )
        self.optional_layers.configure()

    def dashboard_panels(self, now: Any) -> list[Any]:
        """The admin dashboard's panels of this app (see :mod:`ledon.dashboard`)."""
        if not self.dashboard_module:
            return []
        # The module imports the models, loaded by now.
        panels: list[Any] = import_module(self.dashboard_module).dashboard_panels(now)
        return panels
