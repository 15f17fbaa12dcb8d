"""django-ledon outbox: unit of work, domain and integration events, a transactional
outbox and an inbox.

Its public names are imported on first use (see :mod:`ledon.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import exported, lazy_attributes

if TYPE_CHECKING:  # for type checkers; ``as`` marks each name as re-exported
    from .bus import EventBus as EventBus
    from .bus import current_envelope as current_envelope
    from .bus import event_bus as event_bus
    from .events import CollectsEvents as CollectsEvents
    from .events import DomainEvent as DomainEvent
    from .events import Event as Event
    from .events import IntegrationEvent as IntegrationEvent
    from .exceptions import NoActiveUnitOfWork as NoActiveUnitOfWork
    from .exceptions import OutboxError as OutboxError
    from .exceptions import UnitOfWorkRolledBack as UnitOfWorkRolledBack
    from .types import Envelope as Envelope
    from .uow import UnitOfWork as UnitOfWork
    from .uow import current_unit_of_work as current_unit_of_work
    from .uow import unit_of_work as unit_of_work

_LAZY = exported(
    {
        "bus": ("EventBus", "current_envelope", "event_bus"),
        "events": ("CollectsEvents", "DomainEvent", "Event", "IntegrationEvent"),
        "exceptions": ("NoActiveUnitOfWork", "OutboxError", "UnitOfWorkRolledBack"),
        "types": ("Envelope",),
        "uow": ("UnitOfWork", "current_unit_of_work", "unit_of_work"),
    }
)
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
