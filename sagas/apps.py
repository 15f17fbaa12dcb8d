from django.apps import AppConfig, apps

from .exceptions import SagasConfigurationError
from .registry import autodiscover


class SagasConfig(AppConfig):
    name = "sagas"
    verbose_name = "Sagas"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks; they import the models, loaded by now.
        from . import checks  # noqa: F401

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
