from django.apps import AppConfig


class TasksDemoConfig(AppConfig):
    name = "testproject.tasks_demo"
    label = "tasks_demo"
    verbose_name = "Tasks (demo)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import signals  # noqa: F401  (records Django's task signals)
