from django.apps import AppConfig


class FlowConfig(AppConfig):
    """Handlers with flow-control limits (J18). Installed only when ``FLOW_TASKS`` is
    set: a limit makes every claim of the process a claim under limits."""

    name = "testproject.flow"
    label = "flow"
    verbose_name = "Flow control (demo)"
