"""The unit of work: one way to write transactional code.

::

    with unit_of_work() as uow:            # or @unit_of_work on a function
        order = Order.objects.create(...)
        uow.add_domain_event(OrderCreated(order.pk))
        uow.add_integration_event(OrderPlaced(order.pk))

The block runs in ``transaction.atomic``: it commits when the body returns, rolls
back and re-raises the body's exception unchanged otherwise. Domain events are
published on ``event_bus`` after the commit — never after a rollback — in the order
they were added. Integration events are stored in the outbox in the same transaction
(``OUTBOX["ENABLED"]``), or published like domain events after commit.

A unit opened inside another one joins it: no savepoint and no commit of its own.
If it fails, the whole transaction is doomed even when the outer code catches the
error. A unit either commits or raises: when its body returns but the transaction
was doomed (a nested unit failed, a write like ``stage_job`` or an outbox message
failed and the error was caught, ``transaction.set_rollback(True)``), the outermost
unit rolls back and raises :class:`UnitOfWorkRolledBack`, so no caller mistakes
rolled-back work for committed work.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Mapping
from contextlib import ContextDecorator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

from django.db import DatabaseError, transaction
from django.utils import timezone

from ledon.db import alias_for

from . import validation
from .bus import event_bus
from .conf import outbox_settings
from .events import CollectsEvents, DomainEvent, Event, IntegrationEvent, decode
from .exceptions import (
    InvalidEvent,
    InvalidInput,
    NoActiveUnitOfWork,
    UnitOfWorkRolledBack,
    WrongDatabase,
)
from .observability.hooks import trace_headers
from .types import Envelope

if TYPE_CHECKING:
    from django.db.models import Model
    from django.db.transaction import Atomic

MAX_HEADERS = 64


@dataclass
class _Open:
    """The open units of one database alias in one thread."""

    blocks: list[Atomic]
    inner_failure: BaseException | None = None


_local = threading.local()


def _open_units() -> dict[str, _Open]:
    units: dict[str, _Open] | None = getattr(_local, "units", None)
    if units is None:
        units = _local.units = {}
    return units


def _default_alias() -> str:
    # Users import this module (``from outbox import unit_of_work``) at the top of
    # their own modules, their apps' included: the model is imported when a unit of
    # work first needs it, once the app registry is ready.
    from .models import OutboxMessage

    return alias_for(OutboxMessage)


def make_envelope(
    event: IntegrationEvent, *, key: str = "", headers: Mapping[str, str] | None = None
) -> Envelope:
    """The message an integration event becomes: a new id, its JSON, key and headers."""
    key = validation.text(key, "key", validation.MAX_KEY_LENGTH, empty=True)
    header_map = dict(headers or {})
    if len(header_map) > MAX_HEADERS:
        raise InvalidInput(f"at most {MAX_HEADERS} headers")
    for name, value in header_map.items():
        validation.text(name, "header name", validation.MAX_HEADER_LENGTH)
        validation.text(value, f"header {name!r}", validation.MAX_HEADER_LENGTH, empty=True)
    payload_json = event.to_json()
    limit = outbox_settings().MAX_PAYLOAD_BYTES
    if len(payload_json.encode()) > limit:
        raise InvalidEvent(f"{event.event_name}: the payload is larger than {limit} bytes")
    return Envelope(
        message_id=uuid.uuid4(),
        event_type=event.event_name,
        payload_json=payload_json,
        key=key,
        # The current trace context (tracing on), unless the caller gave one.
        headers={**trace_headers(), **header_map},
        created_at=timezone.now(),
    )


class UnitOfWork:
    """A handle on the unit of work open on one database alias in this thread.

    ``with unit_of_work() as uow`` gives one; so does :func:`current_unit_of_work`.
    Adding events needs an open unit; :meth:`execute` opens one (or joins the open one).
    """

    __slots__ = ("using",)

    def __init__(self, using: str | None = None) -> None:
        self.using = using or _default_alias()

    def __repr__(self) -> str:
        return f"<UnitOfWork using={self.using!r} active={self.active}>"

    @property
    def active(self) -> bool:
        return self.using in _open_units()

    def _require_open(self) -> None:
        if not self.active:
            raise NoActiveUnitOfWork()

    def _doomed_by(self, exc: BaseException) -> None:
        unit = _open_units()[self.using]
        if unit.inner_failure is None:
            unit.inner_failure = exc

    def add_domain_event(self, event: DomainEvent) -> None:
        """Publish ``event`` on ``event_bus`` after this transaction commits."""
        if not isinstance(event, DomainEvent):
            raise InvalidEvent(f"expected a DomainEvent, not {type(event).__name__}")
        self._require_open()
        transaction.on_commit(
            functools.partial(event_bus.publish, event), using=self.using, robust=True
        )

    def add_integration_event(
        self,
        event: IntegrationEvent,
        *,
        key: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> Envelope:
        """Send ``event`` to other services reliably: stored in the outbox in this
        transaction when the outbox is enabled, else published on ``event_bus`` after
        commit. Returns the message (its ``message_id`` is stable across deliveries).

        Messages with the same ``key`` are published one at a time, in the order
        they were stored (the order of adding here, of commits across units of
        work), and a parked one halts its key until it is redelivered or discarded;
        keyless messages (``""``) go out in any order. Brokers that support it
        partition by the key.
        """
        if not isinstance(event, IntegrationEvent):
            raise InvalidEvent(f"expected an IntegrationEvent, not {type(event).__name__}")
        self._require_open()
        envelope = make_envelope(event, key=key, headers=headers)
        if outbox_settings().ENABLED:
            from . import store  # imports the models: see _default_alias

            if self.using != _default_alias():
                raise WrongDatabase()
            try:
                store.stage_message(envelope, using=self.using)
            except DatabaseError as exc:
                # The transaction is doomed: the unit must not end as if it committed,
                # even if the caller catches this error.
                self._doomed_by(exc)
                raise
        else:
            # Subscribers get the event as it reads back from its JSON form, exactly as
            # a dispatcher would deliver it: code tested here behaves the same with the
            # outbox enabled.
            delivered = decode(envelope.event_type, envelope.payload_json)
            transaction.on_commit(
                functools.partial(event_bus.publish, delivered, envelope=envelope),
                using=self.using,
                robust=True,
            )
        return envelope

    def add_event(self, event: Event) -> None:
        """Add a domain or an integration event, whichever ``event`` is."""
        if isinstance(event, IntegrationEvent):
            self.add_integration_event(event)
        elif isinstance(event, DomainEvent):
            self.add_domain_event(event)
        else:
            raise InvalidEvent(f"expected an event, not {type(event).__name__}")

    def collect(self, source: CollectsEvents) -> None:
        """Take the events ``source`` recorded and add them, in order."""
        for event in source.take_events():
            self.add_event(event)

    def save(self, instance: Model, **kwargs: Any) -> None:
        """Save a model instance in this unit and collect the events it recorded."""
        self._require_open()
        instance.save(using=self.using, **kwargs)
        if isinstance(instance, CollectsEvents):
            self.collect(instance)


class UnitOfWorkBlock(ContextDecorator):
    """``with`` block and decorator behind :func:`unit_of_work`. Re-entrant and
    thread-safe: its state lives with the thread's open units, not on the object."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def __enter__(self) -> UnitOfWork:
        uow = UnitOfWork(self.using)
        units = _open_units()
        unit = units.get(uow.using)
        root = unit is None
        # The outermost unit is an ordinary atomic block (a savepoint inside a caller's
        # transaction); nested units join it without a savepoint of their own.
        block = transaction.atomic(using=uow.using, savepoint=root)
        block.__enter__()
        if unit is None:
            unit = units[uow.using] = _Open(blocks=[])
        unit.blocks.append(block)
        return uow

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        using = self.using or _default_alias()
        units = _open_units()
        unit = units[using]
        block = unit.blocks.pop()
        if unit.blocks:
            if exc is not None and unit.inner_failure is None:
                unit.inner_failure = exc
            block.__exit__(exc_type, exc, tb)
            return
        del units[using]
        doomed = exc is None and transaction.get_connection(using).needs_rollback
        block.__exit__(exc_type, exc, tb)
        if doomed:
            # The body returned but the transaction was marked for rollback (a nested
            # unit failed, or a write such as stage_job() or an outbox message failed
            # and the error was caught): a unit either commits or raises.
            cause = unit.inner_failure
            reason = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
            raise UnitOfWorkRolledBack(
                "the transaction was rolled back because work inside the unit failed"
                f"{reason}; nothing was committed and no event was dispatched"
            ) from cause


@overload
def unit_of_work[F: Callable[..., Any]](func: F, /) -> F: ...
@overload
def unit_of_work(using: str | None = None, /) -> UnitOfWorkBlock: ...
@overload
def unit_of_work(*, using: str | None = None) -> UnitOfWorkBlock: ...
def unit_of_work(
    func: Callable[..., Any] | str | None = None, /, *, using: str | None = None
) -> Any:
    """Open a unit of work: ``with unit_of_work() as uow:``, ``@unit_of_work`` or
    ``@unit_of_work(using="other")``. See the module documentation."""
    if callable(func):
        return UnitOfWorkBlock(using)(func)
    return UnitOfWorkBlock(func or using)


def current_unit_of_work(using: str | None = None) -> UnitOfWork:
    """The unit of work open on ``using`` in this thread (for ``@unit_of_work``
    functions); raises :class:`NoActiveUnitOfWork` if there is none."""
    uow = UnitOfWork(using)
    if not uow.active:
        raise NoActiveUnitOfWork()
    return uow
