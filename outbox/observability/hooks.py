"""What the outbox tells observers, without importing OpenTelemetry or
prometheus-client: spans through :mod:`ledon.tracing` (``OUTBOX["TRACING"]``) and the
signals of :mod:`outbox.signals`.

A trace crosses the broker in the message's headers: :func:`~outbox.uow.make_envelope`
stores the current context (``traceparent``, ``tracestate``) with each integration
event; the dispatcher publishes each message in a span of its own (kind producer, a
child of that context) and sends the message with the publish span's context; the
consumer handles it in a span that is the publish span's child (kind consumer).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace

from ledon.tracing import Carrier, Span, tracer

from ..exceptions import TransportError
from ..transports.base import Received
from ..types import DeliveryReport, Envelope


def trace_headers() -> Carrier:
    """The current trace context, to store with a new message (empty when off)."""
    return tracer("outbox").current()


@dataclass(slots=True)
class Publishing:
    """The messages as a batch publishes them (with their publish spans' contexts in
    their headers) and the spans, to record the transport's reports on."""

    messages: tuple[Envelope, ...]
    spans: dict[object, Span] = field(default_factory=dict)

    def reported(self, reports: Sequence[DeliveryReport]) -> None:
        for report in reports:
            span = self.spans.get(report.message_id)
            if span is not None and not report.ok:
                span.record_error(TransportError(report.error), message=report.error[:500])


@contextmanager
def publishing(messages: Sequence[Envelope], transport: str) -> Iterator[Publishing]:
    """One producer span per message while the batch publishes."""
    outbox = tracer("outbox")
    if not outbox.enabled:
        yield Publishing(tuple(messages))
        return
    with ExitStack() as stack:
        sent: list[Envelope] = []
        spans: dict[object, Span] = {}
        for message in messages:
            span = stack.enter_context(
                outbox.span(
                    f"outbox.publish {message.event_type}",
                    kind="producer",
                    parent=message.headers,
                    attributes={
                        "messaging.system": transport or "custom",
                        "messaging.operation.type": "send",
                        "messaging.destination.name": message.event_type,
                        "messaging.message.id": str(message.message_id),
                        "ledon.outbox.attempt": message.attempt,
                    },
                )
            )
            spans[message.message_id] = span
            sent.append(replace(message, headers={**message.headers, **span.carrier()}))
        yield Publishing(tuple(sent), spans)


@contextmanager
def consuming(group: str, received: Received) -> Iterator[Span]:
    """The consumer span of one received message, a child of its publish span."""
    envelope = received.envelope
    attributes: dict[str, str | int | float | bool] = {
        "messaging.operation.type": "process",
        "messaging.consumer.group.name": group,
        "ledon.outbox.source": received.source,
    }
    if envelope is not None:
        attributes["messaging.destination.name"] = envelope.event_type
        attributes["messaging.message.id"] = str(envelope.message_id)
    name = envelope.event_type if envelope is not None else received.source
    with tracer("outbox").span(
        f"outbox.consume {name}",
        kind="consumer",
        parent=envelope.headers if envelope is not None else {},
        attributes=attributes,
    ) as span:
        yield span
