"""The base of the three apps' configs: what every app does when Django is ready."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from importlib import import_module
from typing import Any, ClassVar

from django.apps import AppConfig
from django.db.models import Model

from .conf import SettingsReader
from .observability import OptionalLayers


class LedonAppConfig(AppConfig):
    """Registers the app's system checks (``<app>.checks``), sets up its optional
    metrics and tracing as ``optional_layers``, then runs its :meth:`autodiscover`
    and its :meth:`wire_up`. The app's dashboard panels, if it has some, are its
    ``<app>.observability.reads.dashboard_panels(now)``."""

    default_auto_field = "django.db.models.BigAutoField"
    #: The reader of the app's settings dict (its error is the app's configuration error).
    read_settings: ClassVar[SettingsReader[Any]]
    #: The permission to view the rows whose numbers the app's metrics show: the
    #: metrics view answers only users who have it (:func:`ledon.metrics.view_permissions`).
    metrics_permission: ClassVar[str]

    def ready(self) -> None:
        # The checks import the models, loaded by now.
        import_module(f"{self.name}.checks")
        self.optional_layers = OptionalLayers(
            self.name, read_settings=self.read_settings, invalid=self.read_settings.error
        )
        self.optional_layers.configure()
        # A bad setting is left to the system checks to report.
        with suppress(self.read_settings.error):
            self.autodiscover()
        self.wire_up()

    def autodiscover(self) -> None:
        """Like the admin's ``admin.py``: import the installed apps' modules that declare
        this app's things (events and their subscribers, sagas), in every process."""

    def wire_up(self) -> None:
        """Hook the app into the other apps, last in :meth:`ready` and whatever its
        settings say: its receivers of their signals, its handlers of their jobs."""

    def dashboard_panels(
        self, now: Any, may_view: Callable[[type[Model]], bool] | None = None
    ) -> list[Any]:
        """The admin dashboard's panels of this app (see :mod:`ledon.dashboard`). When
        the app's observability reads module names its ``DASHBOARD_MODELS`` and ``may_view``
        lets the user see none of them, its panels are not built (their queries do
        not run)."""
        # The module imports the models, loaded by now.
        module = import_module(f"{self.name}.observability.reads")
        panels = getattr(module, "dashboard_panels", None)
        if panels is None:
            return []
        models = getattr(module, "DASHBOARD_MODELS", None)
        if may_view is not None and models is not None and not any(map(may_view, models)):
            return []
        return list(panels(now))
