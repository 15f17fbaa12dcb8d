from django.utils.module_loading import autodiscover_modules

# The module, not the class: Django takes the one AppConfig subclass named in apps.py.
import ledon.apps

from .conf import outbox_settings


class OutboxConfig(ledon.apps.LedonAppConfig):
    name = "outbox"
    verbose_name = "Outbox and inbox"
    read_settings = outbox_settings
    metrics_permission = "outbox.view_outboxmessage"

    def autodiscover(self) -> None:
        # Each app's events module defines its events and subscribes its handlers, in
        # every process (web, dispatcher, workers).
        module = outbox_settings().AUTODISCOVER_MODULE
        if module:
            autodiscover_modules(module)
