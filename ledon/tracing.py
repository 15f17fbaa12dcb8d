"""The tracing hooks the apps call, without importing OpenTelemetry.

Each app asks :func:`tracer` for its component's tracer ("jobs", "outbox", "sagas") and
opens spans through it. Until :func:`enable` installs the OpenTelemetry tracer for a
component (``JOBS["TRACING"]``, ``OUTBOX["TRACING"]``, ``SAGAS["TRACING"]``, read by each
app's ``ready()``), the tracer does nothing and costs a dictionary look-up:
``opentelemetry`` is imported only by :mod:`ledon.otel`, and only then.

A trace context crosses process boundaries as a *carrier*: a dict of W3C trace context
headers (``traceparent``, ``tracestate``). The jobs store keeps the submitter's carrier
with the job, the outbox keeps it in the message's headers (and brokers carry them), so
that the span of each attempt, publish and consume is a child of the span that caused
it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext

from .spans import AttributeValue, Carrier, Span, SpanKind, SpanStart, Tracer

__all__ = ["AttributeValue", "Carrier", "NoTracer", "Span", "SpanKind", "Tracer", "tracer"]


class _NoSpan:
    def carrier(self) -> Carrier:
        return {}

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        pass

    def record_error(self, exc: BaseException, *, message: str | None = None) -> None:
        pass


_NO_SPAN = _NoSpan()


class NoTracer(Tracer):
    """The tracer of a component whose tracing is off: every span is a no-op."""

    enabled = False

    def start(self, request: SpanStart) -> AbstractContextManager[Span]:
        return nullcontext(_NO_SPAN)

    def current(self) -> Carrier:
        return {}


NO_TRACER = NoTracer()
_tracers: dict[str, Tracer] = {}
_lock = threading.Lock()


def tracer(component: str) -> Tracer:
    """The tracer of ``component`` ("jobs", "outbox", "sagas"): a no-op unless enabled."""
    return _tracers.get(component, NO_TRACER)


def enable(component: str) -> None:
    """Trace ``component`` with OpenTelemetry (the ``[otel]`` extra: ``opentelemetry-api``).

    Spans go to the tracer provider the project configures with the OpenTelemetry SDK;
    without one, OpenTelemetry's own no-op provider drops them."""
    from .otel import OpenTelemetryTracer  # the [otel] extra, only once tracing is on

    with _lock:
        if not _tracers.get(component, NO_TRACER).enabled:
            _tracers[component] = OpenTelemetryTracer(component)


def disable(component: str) -> None:
    with _lock:
        _tracers.pop(component, None)


def carrier_text(carrier: Mapping[str, str]) -> str | None:
    """A carrier as stored (JSON text), or None for an empty one."""
    return json.dumps(dict(carrier), sort_keys=True) if carrier else None


def read_carrier(text: str | None) -> Carrier:
    """A stored carrier; empty if there is none or it is not a JSON object of strings
    (a stored trace context is advisory: a bad one starts a new trace)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
