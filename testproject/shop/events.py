"""Integration events of the shop and its in-process consumer (the mailer)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from outbox import IntegrationEvent, current_envelope, event_bus, unit_of_work
from outbox.inbox import consume

from .models import Notification


@dataclass(frozen=True)
class OrderPlaced(IntegrationEvent, name="shop.order_placed"):
    number: str
    email: str
    total: Decimal


@event_bus.subscribe(OrderPlaced)
def send_confirmation(event: OrderPlaced) -> None:
    """E-mail the customer once per message, however often it is delivered."""
    envelope = current_envelope()
    if envelope is None:  # published without a message (outbox disabled and no envelope)
        return
    with unit_of_work(), consume("shop.mailer", envelope.message_id) as fresh:
        if fresh:
            Notification.objects.create(
                order_number=event.number,
                email=event.email,
                text=f"Thank you for order {event.number} ({event.total} EUR).",
                message_id=envelope.message_id,
            )
