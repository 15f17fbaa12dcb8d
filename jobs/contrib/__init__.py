"""Optional layers of the jobs app, each needing an extra: ``metrics`` (``[metrics]``:
prometheus-client) and tracing through :mod:`ledon.tracing` (``[otel]``:
opentelemetry-api). No core module imports them: :func:`configure` does, when
``JOBS["METRICS"]`` or ``JOBS["TRACING"]`` asks for them (at start-up, and again when
the setting changes).
"""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ledon import observability

from ..conf import jobs_settings
from ..exceptions import JobsConfigurationError

METRICS_MODULE = "jobs.contrib.metrics"


def configure() -> None:
    """Turn the jobs app's metrics and tracing on or off as ``JOBS`` says."""
    try:
        settings = jobs_settings()
    except JobsConfigurationError:
        return  # the system checks report the bad setting
    observability.configure(
        "jobs", metrics=settings.METRICS, traced=settings.TRACING, metrics_module=METRICS_MODULE
    )


def enable_metrics() -> None:
    """Count and gauge from now on, whatever the settings say (``--metrics-port``)."""
    from .metrics import install

    install()


@receiver(setting_changed)
def _reconfigure(*, setting: str, **kwargs: Any) -> None:
    if setting == "JOBS":
        configure()
