from django.apps import AppConfig


class WorkflowChecksConfig(AppConfig):
    """Workflows and activities that the workflow engine's tests drive (in the test
    process and in real ``run_jobs`` processes), with a table their steps write to."""

    name = "testproject.workflow_checks"
    label = "workflow_checks"
    verbose_name = "Workflow checks (tests)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from testproject.faults import install_from_environment

        install_from_environment("WORKFLOWS_FAULT")
