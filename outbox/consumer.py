"""The consumer engine behind ``manage.py consume_events``.

An :class:`EventConsumer` reads a broker through the configured transport's
:class:`~outbox.transports.base.Subscription` and handles each message in one
transaction through the inbox::

    with unit_of_work(), consume(group, message_id) as fresh:
        if fresh:
            event_bus.publish(event, envelope=envelope)   # the local subscribers
    # committed: now acknowledge

How a message finds its handlers: its event type is looked up in the event registry
(:func:`outbox.events.event_class`, never an import path from the message), the
payload is read into that class, and the subscribers of that class on
:data:`outbox.event_bus` run — the same subscribers the in-process transport calls.

===================================== =============================================
the message                           what happens
===================================== =============================================
new, subscribers return               committed with its inbox record, then acked
already in the inbox (a redelivery)   nothing runs; acked ("duplicate")
a registered type this consumer does  acked and counted ("skipped"): the process
not handle                            knows it and has no subscriber for it
an unknown type, or not readable      parked at once, with the reason
a subscriber raises                   rolled back; retried with backoff, parked after
                                      ``max_attempts``
the database is unreachable           rolled back; retried with the engines'
                                      back-off until it is back, said once per
                                      outage (never parked for that)
the broker connection is lost         reconnect with backoff; unacknowledged
                                      messages come again and the inbox skips those
                                      already committed
===================================== =============================================

``stop()`` (SIGTERM, SIGINT) finishes the message being handled — commit and
acknowledgement — then ``run()`` returns.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connections

from ledon.backoff import RetryPace
from ledon.db import TRANSIENT_ERRORS, alias_for
from ledon.engine import EmitsEvents, Engine, EngineStats, EventCallback
from ledon.errors import send_logged
from ledon.registry import EngineRecord

from .bus import event_bus
from .events import Event, IntegrationEvent, decode, registered_events
from .exceptions import (
    HandlerFailed,
    InvalidEvent,
    MessageParked,
    OutboxConfigurationError,
    TransportUnavailable,
    UnknownEventType,
)
from .faults import fault_point
from .inbox import consume
from .models import InboxMessage
from .observability.hooks import consuming
from .signals import message_consumed
from .transports import get_transport
from .transports.base import Received, Subscription
from .types import ConsumeOutcome, Envelope
from .uow import unit_of_work
from .validation import MAX_CONSUMER_LENGTH, text

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ConsumerStats(EngineStats):
    received: int = 0
    handled: int = 0
    duplicate: int = 0
    skipped: int = 0
    parked: int = 0
    abandoned: int = 0
    retries: int = 0
    reconnects: int = 0

    def summary(self) -> str:
        return (
            f"received {self.received}, handled {self.handled}, "
            f"duplicates skipped {self.duplicate}, skipped {self.skipped}, "
            f"parked {self.parked}, retries {self.retries}, reconnects {self.reconnects}"
        )


def subscribed_event_types() -> list[str]:
    """Names of the registered integration events that have a subscriber here."""
    return sorted(
        name
        for name, cls in registered_events().items()
        if issubclass(cls, IntegrationEvent) and event_bus.subscribers(cls)
    )


def handled_event_types(requested: Sequence[str] | None = None) -> list[str]:
    """The event types a consumer handles: ``requested`` (each must be registered and
    subscribed) or, by default, every integration event with a subscriber."""
    if not requested:
        found = subscribed_event_types()
        if not found:
            raise OutboxConfigurationError(
                "no integration event has a subscriber in this process: nothing to "
                "consume (subscribe handlers with event_bus.subscribe in <app>/events.py)"
            )
        return found
    known = registered_events()
    for name in requested:
        cls = known.get(name)
        if cls is None:
            raise OutboxConfigurationError(
                f"event type {name!r} is not registered in this process; registered: "
                f"{', '.join(sorted(known)) or 'none'}"
            )
        if not event_bus.subscribers(cls):
            raise OutboxConfigurationError(f"event type {name!r} has no subscriber here")
    return sorted(set(requested))


class EventConsumer(EmitsEvents, Engine):
    """Handle messages from a broker until stopped.

    ``group`` names the consumer: its inbox records, its RabbitMQ queue (by
    default), its Kafka consumer group. ``run()`` blocks; ``stop()`` may be called
    from any thread (for signals, see :meth:`~ledon.engine.Engine.stop_on_signals`).
    """

    kind = "consumer"
    app_label = "outbox"

    def __init__(
        self,
        group: str,
        *,
        subscription: Subscription | None = None,
        sources: Sequence[str] = (),
        event_types: Sequence[str] | None = None,
        max_attempts: int = 5,
        retry_delay: float = 1.0,
        max_retry_delay: float = 30.0,
        reconnect_delay: float = 0.5,
        max_reconnect_delay: float = 5.0,
        receive_timeout: float = 0.5,
        on_event: EventCallback | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.group = text(group, "consumer group", MAX_CONSUMER_LENGTH)
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.event_types = handled_event_types(event_types)
        self.subscription = subscription or get_transport().subscribe(
            group=self.group, sources=sources, event_types=self.event_types
        )
        self.max_attempts = max_attempts
        #: The pace of retries of a message whose subscriber raised.
        self.retry_pace = RetryPace(retry_delay, 2.0, max_retry_delay, 0.1)
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        self.receive_timeout = receive_timeout
        self.on_event = on_event
        self.rng = rng or random.Random()
        super().__init__(alias=alias_for(InboxMessage), log=logger)
        self.using = self.alias
        self.stats = ConsumerStats()
        self._open = False

    # ------------------------------------------------------------------ control

    @property
    def consumer_id(self) -> str:
        """``group@host:pid``: several consumers share a group, this says which one."""
        return f"{self.group}@{socket.gethostname()}:{os.getpid()}"

    def registry_record(self) -> EngineRecord:
        return EngineRecord(
            kind=self.kind, engine_id=self.consumer_id, queues=tuple(self.event_types)
        )

    # ------------------------------------------------------------------ main loop

    def run(self) -> ConsumerStats:
        logger.info(
            "consumer %s starting: %s",
            self.group,
            self.subscription.describe(),
            extra={"worker": self.consumer_id, "event_types": self.event_types},
        )
        delay = self.reconnect_delay
        try:
            if not self.wait_for_database():
                self._stopping.set()  # stopped before the database answered
            while not self._stopping.is_set():
                try:
                    if not self._open:
                        self.subscription.open()
                        self._open = True
                        delay = self.reconnect_delay
                        self._opened()
                    received = self.subscription.receive(self.receive_timeout)
                    if received is not None:
                        self.stats.received += 1
                        self.process(received)
                except TransportUnavailable as exc:
                    self._lost(exc, delay)
                    delay = min(delay * 2, self.max_reconnect_delay)
        finally:
            self.subscription.close()
            connection = connections[self.using]
            if not connection.in_atomic_block:
                connection.close()
        self._emit("stopped", self.stats.summary())
        return self.stats

    def _opened(self) -> None:
        if self.started.is_set():
            self.stats.reconnects += 1
            logger.warning(
                "consumer %s reconnected",
                self.group,
                extra={"worker": self.consumer_id, "group": self.group},
            )
            self._emit("reconnected", self.subscription.describe())
        else:
            self.started.set()
            self._emit(
                "ready",
                f"{self.subscription.describe()}; event types: {', '.join(self.event_types)}",
            )

    def _lost(self, exc: TransportUnavailable, delay: float) -> None:
        self.subscription.close()
        self._open = False
        logger.warning(
            "consumer %s: broker unavailable, retrying in %.1fs: %s",
            self.group,
            delay,
            exc,
            extra={"worker": self.consumer_id, "group": self.group},
        )
        self._emit("broker-unavailable", str(exc))
        self._stopping.wait(delay)

    # ------------------------------------------------------------------ one message

    def process(self, received: Received) -> ConsumeOutcome:
        """Handle, skip or park one message, then acknowledge it (not when the
        consumer stopped first: then the broker delivers it again) — in its consumer
        span (:mod:`outbox.observability.hooks`)."""
        with consuming(self.group, received) as span:
            outcome = self._process(received)
            span.set_attribute("ledon.outbox.outcome", outcome.value)
            if outcome is ConsumeOutcome.PARKED:
                span.record_error(MessageParked(), message="parked")
        send_logged(
            message_consumed, EventConsumer, "message_consumed", log=logger,
            consumer=self, envelope=received.envelope, outcome=outcome,
        )  # fmt: skip
        return outcome

    def _process(self, received: Received) -> ConsumeOutcome:
        fault_point("outbox.consumer.received", received=received)
        envelope = received.envelope
        if envelope is None:
            outcome = self._park(received, f"undecodable message: {received.problem}")
        elif envelope.event_type not in self.event_types:
            if envelope.event_type in registered_events():
                outcome = self._skip(received, envelope)
            else:
                outcome = self._park(
                    received,
                    f"unknown event type {envelope.event_type!r}: no event class is "
                    "registered under this name in the consuming process",
                )
        else:
            try:
                event = decode(envelope.event_type, envelope.payload_json)
            except (InvalidEvent, UnknownEventType) as exc:
                outcome = self._park(received, f"undecodable message: {exc}")
            else:
                outcome = self._handle_until_done(received, envelope, event)
        if outcome is not ConsumeOutcome.ABANDONED:
            fault_point("outbox.consumer.acknowledged", received=received, outcome=outcome)
        self.stats.count(outcome)
        return outcome

    def _handle_until_done(
        self, received: Received, envelope: Envelope, event: Event
    ) -> ConsumeOutcome:
        failures = 0
        while True:
            began = self.outage.clock()
            try:
                fresh = self._handle_once(envelope, event)
            except TRANSIENT_ERRORS as exc:
                self.stats.retries += 1
                delay = self.database_failed(
                    f"handling {envelope.event_type} {envelope.message_id}", exc, began=began
                )
                if not self._wait(delay):
                    return ConsumeOutcome.ABANDONED
                continue
            except Exception as exc:
                failures += 1
                if failures >= self.max_attempts:
                    return self._park(
                        received, f"handling failed {failures} time(s): {_describe(exc)}"
                    )
                if not self._retry_later(envelope, exc, failures, "a subscriber failed"):
                    return ConsumeOutcome.ABANDONED
                continue
            break
        self.database_ok()
        fault_point("outbox.consumer.committed", envelope=envelope, fresh=fresh)
        self.subscription.ack(received)
        outcome = ConsumeOutcome.HANDLED if fresh else ConsumeOutcome.DUPLICATE
        logger.info(
            "consumer %s: %s %s %s",
            self.group,
            outcome.value,
            envelope.event_type,
            envelope.message_id,
            extra=self._fields(envelope, received),
        )
        self._emit(outcome.value, f"{envelope.message_id} {envelope.event_type}")
        return outcome

    def _handle_once(self, envelope: Envelope, event: Event) -> bool:
        """One transaction: the inbox record and every subscriber's work. True if
        the message was new."""
        connection = connections[self.using]
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()
        with (
            unit_of_work(using=self.using),
            consume(self.group, envelope.message_id, using=self.using) as fresh,
        ):
            if fresh:
                result = event_bus.publish(event, envelope=envelope)
                if not result.ok:
                    for failure in result.failures:
                        if isinstance(failure.error, TRANSIENT_ERRORS):
                            raise failure.error
                    raise HandlerFailed(result.describe_failures())
        return fresh

    def _retry_later(self, envelope: Envelope, exc: Exception, attempt: int, what: str) -> bool:
        """Wait before the next attempt; False if the consumer stopped meanwhile."""
        self.stats.retries += 1
        delay = self.retry_pace.delay(attempt, self.rng)
        logger.warning(
            "consumer %s: %s on %s %s (attempt %d), retrying in %.1fs: %s",
            self.group,
            what,
            envelope.event_type,
            envelope.message_id,
            attempt,
            delay,
            _describe(exc),
            extra={**self._fields(envelope, None), "attempt": attempt},
        )
        self._emit("retry", f"{envelope.message_id} in {delay:.1f}s: {_describe(exc)[:200]}")
        return self._wait(delay)

    def _wait(self, seconds: float) -> bool:
        remaining = seconds
        while remaining > 0 and not self._stopping.is_set():
            step = min(remaining, 0.5)
            self.subscription.pause(step)
            remaining -= step
        return not self._stopping.is_set()

    def _skip(self, received: Received, envelope: Envelope) -> ConsumeOutcome:
        self.subscription.ack(received)
        logger.info(
            "consumer %s: skipped %s %s: no subscriber for this event type here",
            self.group,
            envelope.event_type,
            envelope.message_id,
            extra=self._fields(envelope, received),
        )
        self._emit("skipped", f"{envelope.message_id} {envelope.event_type}")
        return ConsumeOutcome.SKIPPED

    def _park(self, received: Received, reason: str) -> ConsumeOutcome:
        self.subscription.park(received, reason)
        envelope = received.envelope
        logger.error(
            "consumer %s: parked the message from %s: %s",
            self.group,
            received.source,
            reason,
            extra=self._fields(envelope, received),
        )
        self._emit(
            "parked", f"{envelope.message_id if envelope else received.source}: {reason[:500]}"
        )
        return ConsumeOutcome.PARKED

    def _fields(self, envelope: Envelope | None, received: Received | None) -> dict[str, str]:
        return {
            "worker": self.consumer_id,
            "group": self.group,
            "message_id": str(envelope.message_id) if envelope else "",
            "event_type": envelope.event_type if envelope else "",
            "source": received.source if received is not None else "",
        }


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
