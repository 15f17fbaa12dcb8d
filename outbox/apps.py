from django.utils.module_loading import autodiscover_modules

# The module, not the class: Django takes the one AppConfig subclass named in apps.py.
import ledon.apps

from .conf import outbox_settings
from .exceptions import OutboxConfigurationError


class OutboxConfig(ledon.apps.LedonAppConfig):
    name = "outbox"
    verbose_name = "Outbox and inbox"
    read_settings = outbox_settings
    dashboard_module = "outbox.monitoring"

    def ready(self) -> None:
        super().ready()
        # Like the admin's admin.py: each app's events module defines its events and
        # subscribes its handlers, in every process (web, dispatcher, workers).
        try:
            module = outbox_settings().AUTODISCOVER_MODULE
        except OutboxConfigurationError:
            return  # the system checks report the bad setting
        if module:
            autodiscover_modules(module)
