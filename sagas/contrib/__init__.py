"""Optional layers of the sagas app, each needing an extra: ``metrics`` (``[metrics]``:
prometheus-client) and tracing through :mod:`ledon.tracing` (``[otel]``:
opentelemetry-api). No core module imports them: :func:`configure` does, when
``SAGAS["METRICS"]`` or ``SAGAS["TRACING"]`` asks for them (at start-up, and again when
the setting changes).
"""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ledon import observability

from ..conf import sagas_settings
from ..exceptions import SagasConfigurationError

METRICS_MODULE = "sagas.contrib.metrics"


def configure() -> None:
    """Turn the sagas app's metrics and tracing on or off as ``SAGAS`` says."""
    try:
        settings = sagas_settings()
    except SagasConfigurationError:
        return  # the system checks report the bad setting
    observability.configure(
        "sagas", metrics=settings.METRICS, traced=settings.TRACING, metrics_module=METRICS_MODULE
    )


def enable_metrics() -> None:
    """Count and gauge from now on, whatever the settings say (``--metrics-port``)."""
    from .metrics import install

    install()


@receiver(setting_changed)
def _reconfigure(*, setting: str, **kwargs: Any) -> None:
    if setting == "SAGAS":
        configure()
