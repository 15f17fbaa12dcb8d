"""RabbitMQ: publish outbox messages to an exchange, consume them from a queue.

::

    OUTBOX = {
        "ENABLED": True,
        "TRANSPORT": "rabbitmq",
        "TRANSPORT_OPTIONS": {"url": "amqp://user:password@rabbit:5672/%2F"},
    }

Publishing: each message goes to ``exchange`` (a durable topic exchange by default)
with the event type as routing key, as a persistent message (delivery mode 2) with
its message id, type, content type, timestamp and headers (see
:mod:`outbox.transports.wire`). The channel is in publisher-confirm mode: a message
is reported delivered only once RabbitMQ confirmed it. With ``mandatory`` (the
default), a message no queue is bound for comes back as unroutable and is reported
failed — retried, then parked in the outbox — instead of being dropped by the broker.

Consuming (``manage.py consume_events``): a durable queue (named after the consumer
group unless ``queue`` is given) is bound to the exchange for each event type the
process handles; messages are acknowledged one by one after their transaction
committed. Parked messages are published to the durable queue ``<queue>.parked``
(``parked_queue``) with the reason in their headers.

Needs ``pika``: ``pip install 'django-ledon[rabbitmq]'``.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from ..exceptions import TransportError, TransportUnavailable, UndecodableMessage
from ..types import DeliveryReport, Envelope
from . import wire
from .base import Received, Subscription, Transport

logger = logging.getLogger(__name__)

EXCHANGE_TYPES = ("topic", "direct", "fanout", "headers")

_pika = wire.BrokerClient("pika", transport="rabbitmq")


@dataclass(frozen=True, slots=True)
class RabbitMQOptions:
    url: str
    exchange: str = "ledon.events"
    exchange_type: str = "topic"
    declare: bool = True
    mandatory: bool = True
    queue: str | None = None
    queue_arguments: Mapping[str, Any] | None = None
    parked_queue: str | None = None
    prefetch: int = 10
    connect_timeout: float = 5.0


#: The options ``TRANSPORT_OPTIONS`` may give (docs/brokers.md lists them).
OPTIONS = wire.option_spec(RabbitMQOptions)


def _connect(options: RabbitMQOptions) -> Any:
    """A blocking connection, or TransportUnavailable saying why there is none."""
    pika = _pika()
    try:
        parameters = pika.URLParameters(options.url)
    except Exception as exc:
        raise TransportError(f"RabbitMQ url is not valid: {exc}") from exc
    parameters.socket_timeout = options.connect_timeout
    parameters.stack_timeout = options.connect_timeout * 2
    # A broker that blocks publishers (memory or disk alarm) fails the batch
    # instead of holding the dispatcher forever.
    parameters.blocked_connection_timeout = max(options.connect_timeout, 30.0)
    try:
        return pika.BlockingConnection(parameters)
    except (pika.exceptions.ProbableAuthenticationError, pika.exceptions.AuthenticationError):
        raise TransportError("RabbitMQ refused the credentials in the url") from None
    except pika.exceptions.ProbableAccessDeniedError:
        raise TransportError("RabbitMQ denied access to the virtual host in the url") from None
    except (pika.exceptions.AMQPError, OSError) as exc:
        raise TransportUnavailable(
            f"cannot connect to RabbitMQ at {parameters.host}:{parameters.port}: {exc!r}"
        ) from exc


def _close_quietly(connection: Any) -> None:
    if connection is None:
        return
    try:
        if connection.is_open:
            connection.close()
    except Exception:
        logger.debug("closing a RabbitMQ connection failed", exc_info=True)


class RabbitMQTransport(Transport):
    name = "rabbitmq"
    supports_cross_process = True
    # A queue keeps the order the dispatcher publishes one key's messages in, but only
    # one consumer of the queue sees it: several share the queue's messages out.
    supports_key_ordering = False
    supports_headers = True
    supports_partial_batches = True
    supports_consuming = True

    exchange_types: ClassVar[tuple[str, ...]] = EXCHANGE_TYPES

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        _pika()  # a clear error at start-up if the client is missing
        self.settings = RabbitMQOptions(**options)
        self._connection: Any = None
        self._channel: Any = None

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> list[str]:
        problems = _pika.problems() + wire.option_problems(options, OPTIONS)
        if options.get("exchange_type", "topic") not in EXCHANGE_TYPES:
            problems.append(f"'exchange_type' must be one of {', '.join(EXCHANGE_TYPES)}")
        prefetch = options.get("prefetch", 10)
        if isinstance(prefetch, int) and not 1 <= prefetch <= 65535:
            problems.append("'prefetch' must be from 1 to 65535")
        timeout = options.get("connect_timeout", 5.0)
        if isinstance(timeout, int | float) and timeout <= 0:
            problems.append("'connect_timeout' must be positive")
        return problems

    # ------------------------------------------------------------------ publishing

    def _ready_channel(self) -> Any:
        if self._channel is not None and self._channel.is_open:
            return self._channel
        self.close()
        pika = _pika()
        connection = _connect(self.settings)
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            if self.settings.declare:
                channel.exchange_declare(
                    self.settings.exchange, self.settings.exchange_type, durable=True
                )
        except pika.exceptions.ChannelClosedByBroker as exc:
            _close_quietly(connection)
            raise TransportError(
                f"RabbitMQ refused exchange {self.settings.exchange!r}: {exc}"
            ) from exc
        except (pika.exceptions.AMQPError, OSError) as exc:
            _close_quietly(connection)
            raise TransportUnavailable(f"RabbitMQ connection lost: {exc!r}") from exc
        self._connection, self._channel = connection, channel
        return channel

    def properties(self, envelope: Envelope) -> Any:
        """The AMQP properties a message is published with."""
        return _pika().BasicProperties(
            message_id=str(envelope.message_id),
            type=envelope.event_type,
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,  # persistent
            timestamp=int(envelope.created_at.timestamp()),
            headers=wire.envelope_headers(envelope),
        )

    def publish(self, messages: Sequence[Envelope]) -> Sequence[DeliveryReport]:
        pika = _pika()
        channel = self._ready_channel()
        reports: list[DeliveryReport] = []
        for index, envelope in enumerate(messages):
            try:
                channel.basic_publish(
                    self.settings.exchange,
                    envelope.event_type,
                    envelope.payload_json.encode(),
                    self.properties(envelope),
                    mandatory=self.settings.mandatory,
                )
            except pika.exceptions.UnroutableError:
                reports.append(
                    DeliveryReport.failed(
                        envelope.message_id,
                        f"RabbitMQ returned the message: no queue is bound to exchange "
                        f"{self.settings.exchange!r} for routing key {envelope.event_type!r}",
                    )
                )
            except pika.exceptions.NackError:
                reports.append(
                    DeliveryReport.failed(
                        envelope.message_id, "RabbitMQ refused the message (negative confirm)"
                    )
                )
            except (pika.exceptions.AMQPError, OSError) as exc:
                self.close()
                error = f"RabbitMQ connection lost while publishing: {exc!r}"
                reports.extend(DeliveryReport.failed(m.message_id, error) for m in messages[index:])
                break
            else:
                reports.append(DeliveryReport.delivered(envelope.message_id))
        return reports

    def check(self) -> None:
        try:
            self._ready_channel()
        except TransportError as exc:
            if isinstance(exc, TransportUnavailable):
                raise
            # Refused credentials or exchange: the dispatcher keeps the messages
            # Pending with this error until the configuration or the broker is fixed.
            raise TransportUnavailable(str(exc)) from exc

    def close(self) -> None:
        _close_quietly(self._connection)
        self._connection = self._channel = None

    # ------------------------------------------------------------------ consuming

    def subscribe(
        self, *, group: str, sources: Sequence[str], event_types: Sequence[str]
    ) -> RabbitMQSubscription:
        if len(sources) > 1:
            raise TransportError("the rabbitmq transport consumes from one queue at a time")
        queue = sources[0] if sources else self.settings.queue or group
        return RabbitMQSubscription(
            self.settings,
            group=group,
            queue=queue,
            parked_queue=self.settings.parked_queue or f"{queue}.parked",
            event_types=event_types,
        )


@dataclass(frozen=True, slots=True)
class _Delivery:
    delivery_tag: int
    properties: Any
    body: bytes


class RabbitMQSubscription(Subscription):
    """Consume ``queue``; acknowledge each message after its transaction committed."""

    def __init__(
        self,
        settings: RabbitMQOptions,
        *,
        group: str,
        queue: str,
        parked_queue: str,
        event_types: Sequence[str],
    ) -> None:
        self.settings = settings
        self.group = group
        self.queue = queue
        self.parked_queue = parked_queue
        self.event_types = tuple(event_types)
        self._connection: Any = None
        self._channel: Any = None
        self._buffer: collections.deque[_Delivery] = collections.deque()

    def describe(self) -> str:
        return (
            f"queue {self.queue!r} on exchange {self.settings.exchange!r} "
            f"(parked messages: queue {self.parked_queue!r})"
        )

    @contextmanager
    def _broker_errors(self) -> Iterator[None]:
        pika = _pika()
        try:
            yield
        except (pika.exceptions.AMQPError, OSError) as exc:
            self.close()
            raise TransportUnavailable(f"RabbitMQ connection lost: {exc!r}") from exc

    def open(self) -> None:
        pika = _pika()
        self._buffer.clear()
        connection = _connect(self.settings)
        s = self.settings
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_qos(prefetch_count=s.prefetch)
            if s.declare:
                channel.exchange_declare(s.exchange, s.exchange_type, durable=True)
                channel.queue_declare(
                    self.queue, durable=True, arguments=dict(s.queue_arguments or {})
                )
                for event_type in self.event_types:
                    channel.queue_bind(self.queue, s.exchange, routing_key=event_type)
                channel.queue_declare(self.parked_queue, durable=True)
            channel.basic_consume(self.queue, self._on_message)
        except pika.exceptions.ChannelClosedByBroker as exc:
            _close_quietly(connection)
            # A queue declared with other arguments, a missing queue without
            # ``declare``, or no permission: retrying will not help.
            raise TransportError(f"RabbitMQ refused to consume {self.queue!r}: {exc}") from exc
        except (pika.exceptions.AMQPError, OSError) as exc:
            _close_quietly(connection)
            raise TransportUnavailable(f"RabbitMQ connection lost: {exc!r}") from exc
        self._connection, self._channel = connection, channel

    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        self._buffer.append(_Delivery(method.delivery_tag, properties, body))

    def receive(self, timeout: float) -> Received | None:
        if self._connection is None:
            raise TransportUnavailable("the subscription is not open")
        if not self._buffer:
            with self._broker_errors():
                self._connection.process_data_events(time_limit=timeout)
        if not self._buffer:
            return None
        delivery = self._buffer.popleft()
        source = f"queue {self.queue!r}, delivery {delivery.delivery_tag}"
        props = delivery.properties
        try:
            envelope = wire.read_envelope(
                delivery.body,
                wire.text_headers(props.headers),
                message_id=props.message_id,
                event_type=props.type,
            )
        except UndecodableMessage as exc:
            return Received(envelope=None, problem=str(exc), source=source, handle=delivery)
        return Received(envelope=envelope, source=source, handle=delivery)

    def ack(self, message: Received) -> None:
        with self._broker_errors():
            self._channel.basic_ack(message.handle.delivery_tag)

    def park(self, message: Received, reason: str) -> None:
        pika = _pika()
        delivery: _Delivery = message.handle
        original = delivery.properties
        headers = dict(original.headers or {})
        headers.update(
            wire.parked_headers({}, reason=reason, group=self.group, source=message.source)
        )
        properties = pika.BasicProperties(
            message_id=original.message_id,
            type=original.type,
            content_type=original.content_type,
            content_encoding=original.content_encoding,
            timestamp=original.timestamp,
            delivery_mode=2,
            headers=headers,
        )
        with self._broker_errors():
            self._channel.basic_publish(
                "", self.parked_queue, delivery.body, properties, mandatory=True
            )
            self._channel.basic_ack(delivery.delivery_tag)

    def pause(self, seconds: float) -> None:
        if self._connection is None:
            super().pause(seconds)
            return
        with self._broker_errors():
            self._connection.sleep(seconds)

    def close(self) -> None:
        self._buffer.clear()
        _close_quietly(self._connection)
        self._connection = self._channel = None
