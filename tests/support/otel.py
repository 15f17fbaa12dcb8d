"""OpenTelemetry's SDK for the tracing tests: one tracer provider for the test process
(the API accepts a global provider once) whose spans go to an in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None


def exporter() -> InMemorySpanExporter:
    global _exporter
    if _exporter is None:
        _exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    return _exporter


def collected() -> Iterator[InMemorySpanExporter]:
    """The exporter, cleared before and after (conftest's ``spans`` fixture)."""
    found = exporter()
    found.clear()
    yield found
    found.clear()


def named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def one(spans: Sequence[ReadableSpan], prefix: str) -> ReadableSpan:
    found = named(spans, prefix)
    assert len(found) == 1, f"{prefix!r}: {[s.name for s in spans]}"
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None
