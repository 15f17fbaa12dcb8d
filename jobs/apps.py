from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django registers its TASKS checks (jobs.E101-E107 among them) only once
        # django.tasks is imported, which a project need not do before
        # ``manage.py check`` runs.
        import django.tasks  # noqa: F401

        from . import checks  # noqa: F401  (registers the system checks)
        from .handlers import register_autodiscovery
        from .schedules.scheduler import start_scheduler, stop_scheduler
        from .signals import worker_started, worker_stopping

        # J16: every run_jobs worker enqueues its schedules' due periods.
        worker_started.connect(start_scheduler, dispatch_uid="jobs.start_scheduler")
        worker_stopping.connect(stop_scheduler, dispatch_uid="jobs.stop_scheduler")
        # J15: the tasks backend is an adapter above the handler registry; the app
        # wires it in, so that the registry never imports it.
        register_autodiscovery(_autodiscover_tasks)


def _autodiscover_tasks() -> None:
    """Import the task modules of every ``JobsBackend`` in ``TASKS`` (the backend's
    package is imported only when a worker or a test autodiscovers)."""
    # Not at the top: the backend's package (and django.tasks with it) loads only
    # when a worker or a test autodiscovers, not with every start of the app.
    from .backends import autodiscover_tasks

    autodiscover_tasks()
