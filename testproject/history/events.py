"""The workload's integration event and its consumer (imported by every process
through ``OUTBOX["AUTODISCOVER_MODULE"]``).

The consumer handles each message through the inbox: the consumed effect, and the
signal to the order's run, commit with the inbox record (once); the delivery is
recorded after that transaction (at least once)."""

from __future__ import annotations

from dataclasses import dataclass

from outbox import IntegrationEvent, current_envelope, event_bus, unit_of_work
from outbox.inbox import consume
from workflows import send_signal

from .models import Effect
from .tasks import record
from .workload import CONSUMER, MESSAGE, SCOPE, SIGNAL


@dataclass(frozen=True)
class OrderPlaced(IntegrationEvent, name=MESSAGE):
    number: str
    #: The order's workflow run, or "".
    run_id: str


@event_bus.subscribe(OrderPlaced)
def handle_order(event: OrderPlaced) -> None:
    envelope = current_envelope()
    assert envelope is not None, "the workload's consumer handles messages, not bare events"
    message_id = str(envelope.message_id)
    with unit_of_work(), consume(CONSUMER, message_id) as fresh:
        if fresh:
            record(Effect.Kind.CONSUMED, event.number, message_id)
            if event.run_id:
                send_signal(SCOPE, event.run_id, SIGNAL, {"message": message_id})
                record(Effect.Kind.SIGNAL, event.run_id, message_id)
    record(Effect.Kind.DELIVERED, event.number, message_id)
