"""Errors raised by the outbox app. ``OutboxError`` is their root; how to catch and raise
them is said once for every app, at :class:`ledon.errors.DocumentedError`."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from ledon.errors import DocumentedError


class OutboxError(DocumentedError):
    """An error of the outbox app."""


class InvalidInput(OutboxError, ValueError):
    """The input is not valid."""


class InvalidEvent(InvalidInput):
    """An event must be a dataclass instance of a registered event class whose fields
    serialise to JSON."""


class EventNameConflict(OutboxError, TypeError):
    """Another event class is already registered under this name."""


class UnknownEventType(OutboxError, LookupError):
    """No event class is registered under this name (is its module imported?)."""


class NoActiveUnitOfWork(OutboxError):
    """Events can only be added inside an open unit of work (``with unit_of_work()``)."""


class UnitOfWorkRolledBack(OutboxError):
    """The unit of work's body returned, but its transaction had been marked for
    rollback (a nested unit or a write inside it failed): nothing was committed and
    no event was dispatched."""


class WrongDatabase(OutboxError):
    """With the outbox enabled, integration events can only be added in a unit of
    work on the outbox's database: they must commit in the same transaction."""


class TransactionRequired(OutboxError):
    """consume() must run inside transaction.atomic() or a unit of work, so that the
    inbox record commits or rolls back with the handler's work."""


class MessageNotFound(OutboxError, LookupError):
    """No outbox message has this id."""


class InvalidTransition(OutboxError):
    """The message's current state does not allow this transition."""


class MessageParked(OutboxError):
    """The consumer parked the message (its reason is on the parked copy); recorded on
    the message's consume span."""


class TransportError(OutboxError):
    """The transport could not publish."""


class TransportUnavailable(TransportError):
    """The transport's broker cannot be reached."""


class OutboxConfigurationError(OutboxError, ImproperlyConfigured):
    """The OUTBOX setting is not valid."""


class InvalidSubscriber(OutboxError, TypeError):
    """Subscribers are plain callables taking one event, subscribed to an event class."""


class MissingBrokerClient(OutboxConfigurationError):
    """The transport's broker client library is not installed."""


class UndecodableMessage(InvalidInput):
    """A message received from a broker is not in this app's wire format (no valid
    message id or event type, or a body that is not UTF-8 text)."""


class HandlerFailed(OutboxError):
    """A subscriber raised while a received message was handled; its transaction was
    rolled back."""
