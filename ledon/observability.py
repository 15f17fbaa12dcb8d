"""Turning an app's optional metrics and tracing on or off (SPEC M), without importing
prometheus-client or OpenTelemetry before they are asked for."""

from __future__ import annotations

import importlib
import sys

from . import tracing


def configure(component: str, *, metrics: bool, traced: bool, metrics_module: str) -> None:
    """Make ``component``'s tracing and metrics (``metrics_module``'s ``install()`` /
    ``uninstall()``) what the settings say."""
    if traced:
        tracing.enable(component)
    else:
        tracing.disable(component)
    if metrics:
        importlib.import_module(metrics_module).install()
    elif metrics_module in sys.modules:
        sys.modules[metrics_module].uninstall()
