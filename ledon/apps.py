"""The base of the three apps' configs: what every app does when Django is ready."""

from __future__ import annotations

from importlib import import_module
from typing import Any, ClassVar

from django.apps import AppConfig

from .conf import SettingsReader
from .observability import OptionalLayers


class LedonAppConfig(AppConfig):
    """Registers the app's system checks (``<app>.checks``), sets up its optional
    metrics and tracing as ``optional_layers``, then runs its
    :meth:`autodiscover`. The app's dashboard panels, if it has some, are its
    ``<app>.observability.reads.dashboard_panels(now)``."""

    default_auto_field = "django.db.models.BigAutoField"
    #: The reader of the app's settings dict (its error is the app's configuration error).
    read_settings: ClassVar[SettingsReader[Any]]

    def ready(self) -> None:
        # The checks import the models, loaded by now.
        import_module(f"{self.name}.checks")
        self.optional_layers = OptionalLayers(
            self.name, read_settings=self.read_settings, invalid=self.read_settings.error
        )
        self.optional_layers.configure()
        try:
            self.autodiscover()
        except self.read_settings.error:
            return  # the system checks report the bad setting

    def autodiscover(self) -> None:
        """Like the admin's ``admin.py``: import the installed apps' modules that declare
        this app's things (events and their subscribers, sagas), in every process."""

    def dashboard_panels(self, now: Any) -> list[Any]:
        """The admin dashboard's panels of this app (see :mod:`ledon.dashboard`)."""
        # The module imports the models, loaded by now.
        panels = getattr(
            import_module(f"{self.name}.observability.reads"), "dashboard_panels", None
        )
        return list(panels(now)) if panels is not None else []
