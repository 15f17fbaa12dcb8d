from django.apps import AppConfig

from . import tasks_framework


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django registers its TASKS checks (jobs.E101-E107 among them) only once its
        # tasks framework is imported, which a project need not do before
        # ``manage.py check`` runs.
        tasks_framework.register_checks()

        from . import checks  # noqa: F401  (registers the system checks)
        from .handlers import register_autodiscovery
        from .schedules.scheduler import start_scheduler, stop_scheduler
        from .signals import worker_started, worker_stopping

        # J16: every run_jobs worker enqueues its schedules' due periods.
        worker_started.connect(start_scheduler, dispatch_uid="jobs.start_scheduler")
        worker_stopping.connect(stop_scheduler, dispatch_uid="jobs.stop_scheduler")

        # SPEC M: every engine of the three apps keeps its row in jobs_workerrecord
        # (see jobs.monitoring), and the optional metrics and tracing.
        from ledon import registry
        from ledon.observability import OptionalLayers

        from .conf import jobs_settings
        from .exceptions import JobsConfigurationError
        from .monitoring.registry import DatabaseRegistry

        registry.install(DatabaseRegistry())
        self.optional_layers = OptionalLayers(
            "jobs", read_settings=jobs_settings, invalid=JobsConfigurationError
        )
        self.optional_layers.configure()
        # J15: the tasks backend is an adapter above the handler registry; the app
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
