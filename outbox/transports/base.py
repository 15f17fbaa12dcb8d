"""The interface every transport implements.

A transport receives a batch of claimed messages and confirms each one: the
dispatcher marks confirmed messages Sent and retries (or parks) the others. A
transport never touches the outbox tables.

Transports for brokers publish each :class:`~outbox.types.Envelope` with its
``message_id`` (so consumers de-duplicate), ``event_type``, ``key`` and ``headers``,
and confirm a message only once the broker has taken responsibility for it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

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
