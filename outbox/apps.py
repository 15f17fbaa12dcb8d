from typing import Any

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from ledon.observability import OptionalLayers

from .conf import outbox_settings
from .exceptions import OutboxConfigurationError


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox and inbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks; they import the models, loaded by now.
        from . import checks  # noqa: F401

        # SPEC M: the optional metrics and tracing.
        self.optional_layers = OptionalLayers(
            "outbox", read_settings=outbox_settings, invalid=OutboxConfigurationError
        )
        self.optional_layers.configure()

        # Like the admin's admin.py: each app's events module defines its events and
        # subscribes its handlers, in every process (web, dispatcher, workers).
        try:
            module = outbox_settings().AUTODISCOVER_MODULE
        except OutboxConfigurationError:
            return  # the system checks report the bad setting
        if module:
            autodiscover_modules(module)

    def dashboard_panels(self, now: Any) -> list[Any]:
        """The admin dashboard's panels of this app (see :mod:`ledon.dashboard`)."""
        from .monitoring import dashboard_panels  # imports the models, loaded by now

        return dashboard_panels(now)
