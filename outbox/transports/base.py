"""The interface every transport implements.

A transport receives a batch of claimed messages and confirms each one: the
dispatcher marks confirmed messages Sent and retries (or parks) the others. A
transport never touches the outbox tables.

Transports for brokers publish each :class:`~outbox.types.Envelope` with its
``message_id`` (so consumers de-duplicate), ``event_type``, ``key`` and ``headers``,
and confirm a message only once the broker has taken responsibility for it.

A transport that ``supports_consuming`` also has a receiving side, a
:class:`Subscription`, which ``manage.py consume_events`` reads from.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..exceptions import OutboxConfigurationError
from ..types import DeliveryReport, Envelope


class Transport(abc.ABC):
    """Publishes batches of outbox messages somewhere.

    Subclasses set the ``supports_*`` flags truthfully; the dispatcher and the docs
    rely on them.
    """

    #: Short name used in logs (and in ``OUTBOX["TRANSPORT"]`` for built-ins).
    name: ClassVar[str] = ""
    #: Messages leave the dispatcher's process (False: only its own ``event_bus``).
    supports_cross_process: ClassVar[bool] = False
    #: Messages with one ``key`` reach consumers in the order they were published.
    supports_key_ordering: ClassVar[bool] = False
    #: ``headers`` reach consumers.
    supports_headers: ClassVar[bool] = False
    #: Some messages of a batch may be confirmed while others fail.
    supports_partial_batches: ClassVar[bool] = True
    #: ``subscribe()`` gives a :class:`Subscription` (``manage.py consume_events``).
    supports_consuming: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        self.options: Mapping[str, Any] = options

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> list[str]:
        """Problems with ``OUTBOX["TRANSPORT_OPTIONS"]`` for this transport, for the
        system checks; empty when they are fine."""
        return []

    @abc.abstractmethod
    def publish(self, messages: Sequence[Envelope]) -> Sequence[DeliveryReport]:
        """Publish ``messages`` and return one report per message, in any order.

        A message without a report counts as failed. Raising
        :class:`~outbox.exceptions.TransportError` (or any exception) fails the whole
        batch; every message is retried later.
        """

    def check(self) -> None:  # noqa: B027 - optional hook, nothing to check by default
        """Raise :class:`~outbox.exceptions.TransportUnavailable` if the broker cannot
        be reached now. The dispatcher calls it at start-up."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections; the dispatcher calls it when it stops."""

    def subscribe(
        self, *, group: str, sources: Sequence[str], event_types: Sequence[str]
    ) -> Subscription:
        """The receiving side for consumer ``group``: read ``sources`` (queues or
        topics; empty: the transport's default) for messages of ``event_types``."""
        raise OutboxConfigurationError(
            f"the {self.name or type(self).__name__!r} transport has no receiving side; "
            "consume_events needs a broker transport such as 'rabbitmq' or 'kafka'"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Received:
    """One message as a :class:`Subscription` received it.

    ``envelope`` is None when the message is not in the wire format; ``problem``
    then says why. ``source`` says where it came from, for logs. ``handle`` is the
    subscription's own reference to the message (to acknowledge or park it).
    """

    envelope: Envelope | None
    problem: str = ""
    source: str
    handle: Any = field(default=None, repr=False, compare=False)


class Subscription(abc.ABC):
    """The receiving side of a broker transport.

    The consumer engine calls :meth:`open`, then :meth:`receive` in a loop, and for
    each message exactly one of :meth:`ack` or :meth:`park` once its transaction
    committed. A lost broker connection raises
    :class:`~outbox.exceptions.TransportUnavailable` from any method: the engine
    closes the subscription and opens it again, and the broker delivers the
    unacknowledged messages again.
    """

    @abc.abstractmethod
    def open(self) -> None:
        """Connect, declare what the transport declares, and start receiving."""

    @abc.abstractmethod
    def receive(self, timeout: float) -> Received | None:
        """The next message, or None if none came within ``timeout`` seconds."""

    @abc.abstractmethod
    def ack(self, message: Received) -> None:
        """The message is handled (its transaction committed): never deliver it again
        to this consumer group."""

    @abc.abstractmethod
    def park(self, message: Received, reason: str) -> None:
        """Move the message where it waits for an operator (a parking queue or
        topic), with ``reason``, then acknowledge it."""

    def pause(self, seconds: float) -> None:
        """Wait, keeping the broker connection alive (heartbeats)."""
        time.sleep(seconds)

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect; unacknowledged messages go back to the broker. Never raises."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where this subscription reads from, for logs."""
