"""The OpenTelemetry tracer behind :mod:`ledon.tracing` (the ``[otel]`` extra).

Imported only when a component's tracing is enabled. It uses the OpenTelemetry API
alone: where spans go (an exporter, sampling) is the project's tracer provider, set up
with the SDK as for any other instrumented library. Contexts travel through the global
propagator (W3C trace context by default).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from .spans import AttributeValue, Carrier, SpanStart, Tracer
from .spans import Span as SpanProtocol

_KINDS: dict[str, SpanKind] = {
    "internal": SpanKind.INTERNAL,
    "producer": SpanKind.PRODUCER,
    "consumer": SpanKind.CONSUMER,
    "client": SpanKind.CLIENT,
    "server": SpanKind.SERVER,
}


def _version() -> str:
    try:
        return version("django-ledon")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


class _Span:
    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def carrier(self) -> Carrier:
        carrier: Carrier = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def record_error(self, exc: BaseException, *, message: str | None = None) -> None:
        self._span.record_exception(exc)
        self._span.set_status(Status(StatusCode.ERROR, message or f"{type(exc).__name__}: {exc}"))


def _links(carriers: Sequence[Mapping[str, str]]) -> list[Link]:
    links = []
    for carrier in carriers:
        context = trace.get_current_span(propagate.extract(dict(carrier))).get_span_context()
        if context.is_valid:
            links.append(Link(context))
    return links


class OpenTelemetryTracer(Tracer):
    enabled = True

    def __init__(self, component: str) -> None:
        self.component = component
        self._tracer = trace.get_tracer(f"ledon.{component}", _version())

    @contextmanager
    def start(self, request: SpanStart) -> Iterator[SpanProtocol]:
        parent = request.parent
        context = propagate.extract(dict(parent)) if parent is not None else None
        with self._tracer.start_as_current_span(
            request.name,
            context=context,
            kind=_KINDS[request.kind],
            attributes=dict(request.attributes),
            links=_links(request.links),
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            yield _Span(span)

    def current(self) -> Carrier:
        carrier: Carrier = {}
        propagate.inject(carrier)
        return carrier
