"""Integration events of the fulfilment demo (imported by OUTBOX["AUTODISCOVER_MODULE"])."""

from __future__ import annotations

from dataclasses import dataclass

from outbox import IntegrationEvent


@dataclass(frozen=True)
class ShipmentRequested(IntegrationEvent, name="fulfilment.shipment_requested"):
    order_id: int
    shipment_id: int
