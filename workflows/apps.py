from importlib import import_module

from django.apps import AppConfig

from .conf import workflows_settings


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
