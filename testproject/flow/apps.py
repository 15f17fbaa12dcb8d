import os

from django.apps import AppConfig


class FlowConfig(AppConfig):
    """Handlers with flow-control limits. Installed only when ``FLOW_TASKS`` is
    set: a limit makes every claim of the process a claim under limits.

    ``FLOW_UNGUARDED=1`` (process tests only) takes the claim's advisory lock out, so
    that a test can show what breaks without it."""

    name = "testproject.flow"
    label = "flow"
    verbose_name = "Flow control (demo)"

    def ready(self) -> None:
        if os.environ.get("FLOW_UNGUARDED") == "1":
            from jobs.store import limits

            setattr(limits, "lock_ids", lambda names: [])  # noqa: B010
