"""Events of the orders demo and the billing consumer (imported by every process
through OUTBOX["AUTODISCOVER_MODULE"])."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from jobs import JobSubmission, stage_job
from outbox import DomainEvent, IntegrationEvent, current_envelope, event_bus, unit_of_work
from outbox.faults import fault_point
from outbox.inbox import consume

from .models import Delivery, Invoice


@dataclass(frozen=True)
class OrderCreated(DomainEvent, name="orders.created"):
    number: str


@dataclass(frozen=True)
class OrderPlaced(IntegrationEvent, name="orders.placed"):
    number: str
    total: Decimal
    placed_at: datetime


@dataclass(frozen=True)
class InvoiceIssued(IntegrationEvent, name="billing.invoice_issued"):
    number: str
    total: Decimal


@event_bus.subscribe(OrderPlaced)
def bill_order(event: OrderPlaced) -> None:
    """Issue one invoice per order, however often the message is delivered: inbox
    record, invoice, rendering job and the next event commit together or not at all."""
    envelope = current_envelope()
    assert envelope is not None, "billing consumes messages, not bare events"
    with unit_of_work() as uow, consume("billing", envelope.message_id) as fresh:
        fault_point("orders.billing.inbox_recorded")
        if fresh:
            Invoice.objects.create(
                order_number=event.number, total=event.total, message_id=str(envelope.message_id)
            )
            fault_point("orders.billing.invoice_created")
            stage_job(
                "billing",
                f"invoice-{event.number}",
                JobSubmission.create("invoices.render", {"number": event.number}),
            )
            fault_point("orders.billing.job_staged")
            uow.add_integration_event(InvoiceIssued(event.number, event.total), key=event.number)
            fault_point("orders.billing.event_added")
    Delivery.objects.create(
        message_id=str(envelope.message_id),
        event_type=envelope.event_type,
        fresh=fresh,
        pid=os.getpid(),
    )
