# The module, not the class: Django takes the one AppConfig subclass named in apps.py.
import ledon.apps

from . import tasks_framework
from .conf import jobs_settings


class JobsConfig(ledon.apps.LedonAppConfig):
    name = "jobs"
    verbose_name = "Jobs"
    read_settings = jobs_settings
    metrics_permission = "jobs.view_job"

    def ready(self) -> None:
        # Django registers its TASKS checks (jobs.E101-E107 among them) only once its
        # tasks framework is imported, which a project need not do before
        # ``manage.py check`` runs.
        tasks_framework.register_checks()

        # Not at the top: the scheduler imports the models, loaded by now.
        from .handlers import register_autodiscovery
        from .schedules.scheduler import start_scheduler, stop_scheduler
        from .signals import worker_started, worker_stopping

        # Every run_jobs worker enqueues its schedules' due periods.
        worker_started.connect(start_scheduler, dispatch_uid="jobs.start_scheduler")
        worker_stopping.connect(stop_scheduler, dispatch_uid="jobs.stop_scheduler")

        # Every engine of the three apps keeps its row in jobs_workerrecord
        # (see jobs.observability); then the checks and the optional metrics and tracing.
        from ledon import registry

        from .observability.worker_registry import DatabaseRegistry

        registry.install(DatabaseRegistry())
        super().ready()
        # The tasks backend is an adapter above the handler registry; the app
        # wires it in, so that the registry never imports it.
        register_autodiscovery(_autodiscover_tasks)


def _autodiscover_tasks() -> None:
    """Import the task modules of every ``JobsBackend`` in ``TASKS`` (the backend's
    package is imported only when a worker or a test autodiscovers, and only when this
    Django has a tasks framework: on Django 5.2 the backport may be missing)."""
    if not tasks_framework.available():
        return
    # Not at the top: the backend's package (and the tasks framework with it) loads
    # only when a worker or a test autodiscovers, not with every start of the app.
    from .backends import autodiscover_tasks

    autodiscover_tasks()
