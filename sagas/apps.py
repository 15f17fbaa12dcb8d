from typing import Any

from django.apps import AppConfig, apps

from ledon.observability import OptionalLayers

from .conf import sagas_settings
from .exceptions import SagasConfigurationError
from .registry import autodiscover


class SagasConfig(AppConfig):
    name = "sagas"
    verbose_name = "Sagas"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks; they import the models, loaded by now.
        from . import checks  # noqa: F401

        # SPEC M: the optional metrics and tracing.
        self.optional_layers = OptionalLayers(
            "sagas", read_settings=sagas_settings, invalid=SagasConfigurationError
        )
        self.optional_layers.configure()

        if apps.is_installed("jobs"):
            # S5: every run_jobs worker also recovers saga instances. Imported only
            # with jobs installed; in_worker imports the models, loaded by now.
            from jobs.signals import worker_started, worker_stopping

            from .in_worker import start_recovery, stop_recovery

            worker_started.connect(start_recovery, dispatch_uid="sagas.start_recovery")
            worker_stopping.connect(stop_recovery, dispatch_uid="sagas.stop_recovery")
        # Like the admin's admin.py: each app's sagas module registers its sagas, in
        # every process (web, recover_sagas, shells), so any of them can run or
        # recover an instance by its saga's name.
        try:
            autodiscover()
        except SagasConfigurationError:
            return  # the system checks report the bad setting

    def dashboard_panels(self, now: Any) -> list[Any]:
        """The admin dashboard's panels of this app (see :mod:`ledon.dashboard`)."""
        from .monitoring import dashboard_panels  # imports the models, loaded by now

        return dashboard_panels(now)
