from django.apps import AppConfig


class TimetableConfig(AppConfig):
    name = "testproject.timetable"
    label = "timetable"
    verbose_name = "Schedules (demo)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from testproject.faults import install_from_environment

        from .statements import install_from_environment as log_statements

        install_from_environment("JOBS_FAULT")
        log_statements("STATEMENT_LOG")
