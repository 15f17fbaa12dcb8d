"""Turning an app's optional metrics and tracing on or off, without importing
prometheus-client or OpenTelemetry before they are asked for.

Each app config keeps one :class:`OptionalLayers` as ``optional_layers``: its ``ready()``
calls :meth:`~OptionalLayers.configure`, which reads the app's ``METRICS`` and
``TRACING`` settings and loads what they ask for (again whenever the setting changes);
:meth:`~OptionalLayers.enable_metrics` turns the metrics on whatever the settings say
(``--metrics-port``, the metrics view). A setting that asks for a library that is not
installed is an :class:`~django.core.exceptions.ImproperlyConfigured` naming the extra.

An app's ``observability`` package (outbox, sagas, workflows) is laid out the same way:

- ``hooks`` — what the app tells observers, without importing OpenTelemetry or
  prometheus-client: spans through :mod:`ledon.tracing` and the app's signals;
- ``reads`` — the reads behind the database gauges and the admin's dashboard;
- ``metrics`` — Prometheus metrics, an optional layer (``[metrics]``:
  prometheus-client). No core module imports it: the app's :class:`OptionalLayers`
  does, when the app's ``METRICS`` setting asks for it (at start-up, and again when
  the setting changes).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from . import tracing


class ObservedSettings(Protocol):
    @property
    def METRICS(self) -> bool: ...
    @property
    def TRACING(self) -> bool: ...


#: The components whose metrics are on in this process: by their setting, or turned
#: on by :meth:`OptionalLayers.enable_metrics` (``--metrics-port``, the metrics view).
_metrics_on: set[str] = set()


def metrics_enabled(component: str) -> bool:
    """Whether ``component``'s metrics are on in this process (read by the parts that
    measure without a signal to count from: the jobs' metrics middleware)."""
    return component in _metrics_on


#: What each setting needs: its library and the extra that installs it.
NEEDS = {"METRICS": ("prometheus-client", "metrics"), "TRACING": ("opentelemetry-api", "otel")}


def _missing(setting: str, key: str, exc: ImportError) -> ImproperlyConfigured:
    library, extra = NEEDS[key]
    return ImproperlyConfigured(
        f"{setting}[{key!r}] needs {library}, which is not installed: "
        f"pip install 'django-ledon[{extra}]' ({exc})"
    )


def configure(component: str, *, metrics: bool, traced: bool, metrics_module: str) -> None:
    """Make ``component``'s tracing and metrics (``metrics_module``'s ``APP_METRICS``,
    a :class:`ledon.prometheus.AppMetrics`) what the settings say."""
    setting = component.upper()
    if traced:
        try:
            tracing.enable(component)
        except ImportError as exc:
            raise _missing(setting, "TRACING", exc) from None
    else:
        tracing.disable(component)
    if metrics:
        try:
            module = importlib.import_module(metrics_module)
        except ImportError as exc:
            raise _missing(setting, "METRICS", exc) from None
        module.APP_METRICS.install()
        _metrics_on.add(component)
    else:
        _metrics_on.discard(component)
        if metrics_module in sys.modules:
            sys.modules[metrics_module].APP_METRICS.uninstall()


class OptionalLayers:
    """One app's optional layers: ``component`` is its name and its setting's, in lower
    case ("jobs": ``JOBS``); ``read_settings`` reads that setting, raising
    ``invalid`` when it is not valid (the app's system check reports it; nothing is
    turned on); ``<component>.observability.metrics`` has the app's ``APP_METRICS``. The app
    config keeps it as ``optional_layers``, where :func:`ledon.prometheus.enable_all`
    finds it."""

    def __init__(
        self,
        component: str,
        *,
        read_settings: Callable[[], ObservedSettings],
        invalid: type[Exception],
    ) -> None:
        self.component = component
        self.read_settings = read_settings
        self.invalid = invalid
        self.metrics_module = f"{component}.observability.metrics"
        setting_changed.connect(
            self._setting_changed, weak=False, dispatch_uid=f"{component}.optional_layers"
        )

    def configure(self) -> None:
        """Turn the app's metrics and tracing on or off as its setting says."""
        try:
            settings = self.read_settings()
        except self.invalid:
            return  # the system checks report the bad setting
        configure(
            self.component,
            metrics=settings.METRICS,
            traced=settings.TRACING,
            metrics_module=self.metrics_module,
        )

    def enable_metrics(self) -> None:
        """Count and gauge from now on, whatever the settings say."""
        try:
            module = importlib.import_module(self.metrics_module)
        except ImportError as exc:
            raise _missing(self.component.upper(), "METRICS", exc) from None
        module.APP_METRICS.install()
        _metrics_on.add(self.component)

    def _setting_changed(self, *, setting: str, **kwargs: Any) -> None:
        if setting == self.component.upper():
            self.configure()
