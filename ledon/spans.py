"""The shapes of :mod:`ledon.tracing` — a carrier, a span, a tracer — shared by the
no-op tracer there and the OpenTelemetry one in :mod:`ledon.otel`, which imports
them from here (and :mod:`ledon.tracing` imports :mod:`ledon.otel` only when tracing
is turned on)."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal, Protocol

#: W3C trace context headers, as a dict (empty: no trace).
Carrier = dict[str, str]
SpanKind = Literal["internal", "producer", "consumer", "client", "server"]
AttributeValue = str | int | float | bool


class Span(Protocol):
    def carrier(self) -> Carrier:
        """This span's context, to hand to the work it causes."""
        ...

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...

    def record_error(self, exc: BaseException, *, message: str | None = None) -> None:
        """Record ``exc`` on the span and mark the span as failed (for errors that do
        not propagate out of the ``with`` block; those that do are recorded anyway)."""
        ...


@dataclass(frozen=True, slots=True)
class SpanStart:
    """What :meth:`Tracer.span` was asked for, as each tracer's :meth:`Tracer.start`
    receives it."""

    name: str
    kind: SpanKind
    attributes: Mapping[str, AttributeValue]
    parent: Mapping[str, str] | None
    links: Sequence[Mapping[str, str]]


class Tracer(abc.ABC):
    """A component's tracer: :meth:`span` is the one signature the apps call; each
    tracer says in :meth:`start` how it opens the span."""

    #: False for the tracer that does nothing.
    enabled: bool

    def span(
        self,
        name: str,
        *,
        kind: SpanKind = "internal",
        attributes: Mapping[str, AttributeValue] | None = None,
        parent: Mapping[str, str] | None = None,
        links: Sequence[Mapping[str, str]] = (),
    ) -> AbstractContextManager[Span]:
        """A span, current while the block runs, that records an exception leaving the
        block. ``parent``: a carrier to be the child of (default: the current span;
        a carrier without a trace starts a new trace); ``links``: carriers of related
        spans (earlier attempts)."""
        return self.start(SpanStart(name, kind, attributes or {}, parent, links))

    @abc.abstractmethod
    def start(self, request: SpanStart) -> AbstractContextManager[Span]:
        """The span ``request`` asks for (see :meth:`span`)."""

    @abc.abstractmethod
    def current(self) -> Carrier:
        """The current span's context as a carrier (empty when there is none)."""
