from django.apps import apps

# The module, not the class: Django takes the one AppConfig subclass named in apps.py.
import ledon.apps

from . import registry
from .conf import sagas_settings


class SagasConfig(ledon.apps.LedonAppConfig):
    name = "sagas"
    verbose_name = "Sagas"
    read_settings = sagas_settings
    metrics_permission = "sagas.view_sagainstance"

    def wire_up(self) -> None:
        if apps.is_installed("jobs"):
            # Every run_jobs worker also recovers saga instances. Imported only
            # with jobs installed; in_worker imports the models, loaded by now.
            from jobs.signals import worker_started, worker_stopping

            from .in_worker import start_recovery, stop_recovery

            worker_started.connect(start_recovery, dispatch_uid="sagas.start_recovery")
            worker_stopping.connect(stop_recovery, dispatch_uid="sagas.stop_recovery")

    def autodiscover(self) -> None:
        # Each app's sagas module registers its sagas, in every process (web,
        # recover_sagas, shells), so any of them can run or recover an instance by its
        # saga's name.
        registry.autodiscover()
