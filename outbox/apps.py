from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from .conf import outbox_settings
from .exceptions import OutboxConfigurationError


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox and inbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks; they import the models, loaded by now.
        from . import checks  # noqa: F401

        # Like the admin's admin.py: each app's events module defines its events and
        # subscribes its handlers, in every process (web, dispatcher, workers).
        try:
            module = outbox_settings().AUTODISCOVER_MODULE
        except OutboxConfigurationError:
            return  # the system checks report the bad setting
        if module:
            autodiscover_modules(module)
