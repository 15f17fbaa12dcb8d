"""django-ledon outbox: unit of work, domain and integration events, a transactional
outbox and an inbox.

Names are imported lazily so that listing ``"outbox"`` in ``INSTALLED_APPS`` never
imports models before the app registry is ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import lazy_attributes

if TYPE_CHECKING:
    from .bus import EventBus, current_envelope, event_bus
    from .events import CollectsEvents, DomainEvent, Event, IntegrationEvent
    from .types import Envelope
    from .uow import UnitOfWork, current_unit_of_work, execute, unit_of_work

__all__ = [
    "CollectsEvents",
    "DomainEvent",
    "Envelope",
    "Event",
    "EventBus",
    "IntegrationEvent",
    "UnitOfWork",
    "current_envelope",
    "current_unit_of_work",
    "event_bus",
    "execute",
    "unit_of_work",
]

_LAZY = {
    "EventBus": "bus",
    "current_envelope": "bus",
    "event_bus": "bus",
    "CollectsEvents": "events",
    "DomainEvent": "events",
    "Event": "events",
    "IntegrationEvent": "events",
    "Envelope": "types",
    "UnitOfWork": "uow",
    "current_unit_of_work": "uow",
    "execute": "uow",
    "unit_of_work": "uow",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
