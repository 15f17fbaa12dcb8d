from django.apps import AppConfig


class HistoryConfig(AppConfig):
    """The workload of the chaos test (``python -m chaos``): job handlers, a workflow, a
    saga and a message consumer that record every effect they have, with its ids, in
    one table the checker reads afterwards."""

    name = "testproject.history"
    label = "history"
    verbose_name = "History (chaos workload)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from testproject.faults import install_from_environment

        install_from_environment("CHAOS_FAULT")
