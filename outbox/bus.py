"""The in-process event bus: subscribe and publish by event type.

A subscriber receives events of its type and of every subclass. Subscribers run one
after the other in the publishing thread; one that raises is logged and the others
still run — but one that raises because the database is unreachable is logged once
per outage, not once per event, and as a warning: the engine that published (the
dispatcher, the consumer) reports the outage itself. While a subscriber runs for a
message delivered from the outbox (or an integration event published after commit),
:func:`current_envelope` gives the message's id, for de-duplication with
:func:`outbox.inbox.consume`.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from ledon.db import TRANSIENT_ERRORS
from ledon.outage import OutageReporter

from .events import Event
from .exceptions import InvalidSubscriber
from .types import Envelope

logger = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)
Handler = Callable[[Any], object]
H = TypeVar("H", bound=Handler)

_current_envelope: ContextVar[Envelope | None] = ContextVar("outbox_envelope", default=None)


def current_envelope() -> Envelope | None:
    """The message being delivered to the running subscriber, if it is one."""
    return _current_envelope.get()


@contextmanager
def _delivering(envelope: Envelope | None) -> Iterator[None]:
    token = _current_envelope.set(envelope)
    try:
        yield
    finally:
        _current_envelope.reset(token)


def handler_name(handler: Handler) -> str:
    module = getattr(handler, "__module__", None) or "?"
    return f"{module}.{getattr(handler, '__qualname__', repr(handler))}"


@dataclass(frozen=True, slots=True)
class SubscriberFailure:
    handler: str
    error: Exception


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What one publish did: how many subscribers ran and which of them raised."""

    called: int
    failures: tuple[SubscriberFailure, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures

    def describe_failures(self) -> str:
        return "; ".join(f"{f.handler}: {type(f.error).__name__}: {f.error}" for f in self.failures)


class EventBus:
    """Subscribers by event class; thread-safe to subscribe and publish."""

    def __init__(self) -> None:
        self._subscribers: dict[type[Event], list[Handler]] = {}
        self._lock = threading.Lock()
        # A WARNING: the engine whose step this is (the dispatcher, the consumer)
        # reports the outage itself, at ERROR, once; a second ERROR line for the
        # same outage would only double the alarm.
        self._outage = OutageReporter(logger, "database", level=logging.WARNING)

    @overload
    def subscribe(self, event_type: type[E], handler: None = None) -> Callable[[H], H]: ...
    @overload
    def subscribe(self, event_type: type[E], handler: H) -> H: ...
    def subscribe(self, event_type: type[E], handler: H | None = None) -> Any:
        """Call ``handler(event)`` for every published event of ``event_type`` (and its
        subclasses). Subscribing the same handler twice has no effect. Without
        ``handler``, returns a decorator."""
        if not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise InvalidSubscriber(f"subscribe to an event class, not {event_type!r}")
        if handler is None:

            def decorator(func: H) -> H:
                self.subscribe(event_type, func)
                return func

            return decorator
        if not callable(handler) or inspect.iscoroutinefunction(handler):
            raise InvalidSubscriber(
                f"{handler!r} is not a plain callable; subscribers take one event and "
                "run synchronously"
            )
        with self._lock:
            handlers = self._subscribers.setdefault(event_type, [])
            if handler not in handlers:
                handlers.append(handler)
        return handler

    def unsubscribe(self, event_type: type[Event], handler: Handler) -> bool:
        """Remove a subscription; False if there was none."""
        with self._lock:
            handlers = self._subscribers.get(event_type, [])
            if handler in handlers:
                handlers.remove(handler)
                return True
        return False

    def subscribers(self, event_type: type[Event]) -> list[Handler]:
        """Who receives events of ``event_type``: its own subscribers first, then those
        of its base classes, each in subscription order, each once."""
        found: list[Handler] = []
        with self._lock:
            for cls in event_type.__mro__:
                for handler in self._subscribers.get(cls, ()):
                    if handler not in found:
                        found.append(handler)
        return found

    def publish(self, event: Event, *, envelope: Envelope | None = None) -> PublishResult:
        """Run every subscriber of ``event`` now, in this thread. A subscriber that
        raises is logged and reported in the result; the others still run."""
        if not isinstance(event, Event):
            raise InvalidSubscriber(f"publish an event, not {type(event).__name__}")
        handlers = self.subscribers(type(event))
        failures: list[SubscriberFailure] = []
        with _delivering(envelope):
            for handler in handlers:
                try:
                    handler(event)
                    self._outage.recovered()
                except Exception as exc:
                    name = handler_name(handler)
                    failures.append(SubscriberFailure(name, exc))
                    if isinstance(exc, TRANSIENT_ERRORS):
                        # The database is down: one line per outage, not one per
                        # event (the outbox delivers the event again later).
                        self._outage.failed(
                            exc,
                            doing=f"subscriber {name} on event {event.event_name}",
                            retry_in=None,
                        )
                        continue
                    logger.exception(
                        "subscriber %s failed on event %s",
                        name,
                        event.event_name,
                        extra={
                            "subscriber": name,
                            "event_type": event.event_name,
                            "message_id": str(envelope.message_id) if envelope else None,
                        },
                    )
        return PublishResult(called=len(handlers), failures=tuple(failures))


#: The process's event bus.
event_bus = EventBus()
