"""Kafka: publish outbox messages to a topic, consume them in a consumer group.

::

    OUTBOX = {
        "ENABLED": True,
        "TRANSPORT": "kafka",
        "TRANSPORT_OPTIONS": {"bootstrap_servers": "kafka1:9092,kafka2:9092"},
    }

Publishing: an idempotent producer (``enable.idempotence``, ``acks=all``) writes each
message to ``topic`` with the outbox key as the record key — so one key's messages
land in one partition, in the order they were published — the event's JSON as the
value and the envelope in headers (see :mod:`outbox.transports.wire`). A message is
reported delivered only when the broker acknowledged it; one the producer could not
deliver within ``delivery_timeout`` seconds is reported failed and retried. A producer
that hit a fatal error (for instance after the broker lost its state) is replaced.

Consuming (``manage.py consume_events``): the consumer group is the inbox consumer
name; offsets are committed by hand, synchronously, after each message's
transaction committed (never automatically), and a new group starts at the earliest
retained offset. Parked messages are produced to ``<group>.parked``
(``parked_topic``) with the reason in their headers.

Needs ``confluent-kafka``: ``pip install 'django-ledon[kafka]'``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import TransportError, TransportUnavailable, UndecodableMessage
from ..types import DeliveryReport, Envelope
from . import wire
from .base import Received, Subscription, Transport

logger = logging.getLogger(__name__)
client_logger = logging.getLogger(f"{__name__}.client")

#: Producer settings that make delivery reliable; the options cannot change them.
RELIABLE_PRODUCER = {"enable.idempotence": True, "acks": "all"}
#: Consumer settings the engine depends on: offsets are committed by hand after commit.
OWN_CONSUMER_KEYS = ("group.id", "enable.auto.commit", "enable.auto.offset.store")


_kafka = wire.BrokerClient("confluent_kafka", transport="kafka")


@dataclass(frozen=True, slots=True)
class KafkaOptions:
    bootstrap_servers: str
    topic: str = "ledon.events"
    parked_topic: str | None = None
    producer_config: Mapping[str, Any] = field(default_factory=dict)
    consumer_config: Mapping[str, Any] = field(default_factory=dict)
    delivery_timeout: float = 30.0
    connect_timeout: float = 5.0


#: The options ``TRANSPORT_OPTIONS`` may give (docs/brokers.md lists them).
OPTIONS = wire.option_spec(KafkaOptions)


class _ErrorLog:
    """librdkafka reports a broker outage many times a second: log each new error
    once as a warning, its repetitions at debug level."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.last_code: int | None = None
        self.fatal: Any = None

    def __call__(self, error: Any) -> None:
        if error.fatal():
            self.fatal = error
        level = logging.WARNING if error.code() != self.last_code else logging.DEBUG
        self.last_code = error.code()
        logger.log(level, "kafka %s: %s", self.what, error)


def _producer(settings: KafkaOptions) -> tuple[Any, _ErrorLog]:
    errors = _ErrorLog("producer")
    config = {
        "bootstrap.servers": settings.bootstrap_servers,
        "message.timeout.ms": int(settings.delivery_timeout * 1000),
        "socket.connection.setup.timeout.ms": max(1000, int(settings.connect_timeout * 1000)),
        # Errors reach error_cb (logged once per kind); the client's own log of every
        # failed reconnection would flood the log during a broker outage.
        "log_level": 2,
        **settings.producer_config,
        **RELIABLE_PRODUCER,
        "error_cb": errors,
        "logger": client_logger,
    }
    try:
        return _kafka().Producer(config), errors
    except _kafka().KafkaException as exc:
        raise TransportError(f"the Kafka producer configuration is not valid: {exc}") from exc


class KafkaTransport(Transport):
    name = "kafka"
    supports_cross_process = True
    # The key is the record key: one key's messages share a partition, in the order
    # the dispatcher publishes them (one at a time, in stored order).
    supports_key_ordering = True
    supports_headers = True
    supports_partial_batches = True
    supports_consuming = True

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        _kafka()  # a clear error at start-up if the client is missing
        self.settings = KafkaOptions(**options)
        self._producer: Any = None
        self._errors: _ErrorLog | None = None

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> list[str]:
        problems = _kafka.problems() + wire.option_problems(options, OPTIONS)
        for key in ("delivery_timeout", "connect_timeout"):
            value = options.get(key, 1)
            if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
                problems.append(f"{key!r} must be positive")
        producer = options.get("producer_config") or {}
        if isinstance(producer, dict):
            problems += [
                f"producer_config may not set {key!r}: the transport needs {value!r}"
                for key, value in RELIABLE_PRODUCER.items()
                if key in producer and producer[key] != value
            ]
        consumer = options.get("consumer_config") or {}
        if isinstance(consumer, dict):
            problems += [
                f"consumer_config may not set {key!r}: consume_events sets it"
                for key in OWN_CONSUMER_KEYS
                if key in consumer
            ]
        for name in ("producer_config", "consumer_config"):
            config = options.get(name) or {}
            if isinstance(config, dict) and "bootstrap.servers" in config:
                problems.append(f"{name} may not set 'bootstrap.servers': use bootstrap_servers")
        return problems

    # ------------------------------------------------------------------ publishing

    def _ready_producer(self) -> tuple[Any, _ErrorLog]:
        if self._producer is None or self._errors is None or self._errors.fatal is not None:
            self._discard_producer()
            self._producer, self._errors = _producer(self.settings)
        return self._producer, self._errors

    def _discard_producer(self) -> None:
        if self._producer is not None:
            try:
                self._producer.purge()
                self._producer.flush(0)
            except Exception:
                logger.debug("discarding the Kafka producer failed", exc_info=True)
        self._producer = self._errors = None

    def publish(self, messages: Sequence[Envelope]) -> Sequence[DeliveryReport]:
        kafka = _kafka()
        producer, errors = self._ready_producer()
        topic = self.settings.topic
        try:
            producer.list_topics(topic, timeout=self.settings.connect_timeout)
        except kafka.KafkaException as exc:
            raise TransportUnavailable(f"Kafka is not reachable: {exc}") from exc

        reports: dict[uuid.UUID, DeliveryReport] = {}

        def on_delivery(message_id: uuid.UUID) -> Any:
            def report(error: Any, record: Any) -> None:
                if error is None:
                    reports[message_id] = DeliveryReport.delivered(message_id)
                else:
                    if error.fatal():
                        errors.fatal = error
                    reports[message_id] = DeliveryReport.failed(message_id, f"Kafka: {error}")

            return report

        for envelope in messages:
            try:
                producer.produce(
                    topic,
                    value=envelope.payload_json.encode(),
                    key=envelope.key.encode() if envelope.key else None,
                    headers=[(k, v.encode()) for k, v in wire.envelope_headers(envelope).items()],
                    on_delivery=on_delivery(envelope.message_id),
                )
            except BufferError:
                producer.poll(1.0)  # the local queue is full: let it drain, retry later
                reports[envelope.message_id] = DeliveryReport.failed(
                    envelope.message_id, "Kafka producer queue is full"
                )
            except kafka.KafkaException as exc:
                if exc.args and exc.args[0].fatal():
                    errors.fatal = exc.args[0]
                reports[envelope.message_id] = DeliveryReport.failed(
                    envelope.message_id, f"Kafka refused the message: {exc}"
                )
        try:
            left = producer.flush(self.settings.delivery_timeout + 5)
        except kafka.KafkaException as exc:
            errors.fatal = exc.args[0] if exc.args else exc
            left = len(messages) - len(reports)
        result = [
            reports.get(m.message_id)
            or DeliveryReport.failed(
                m.message_id,
                f"Kafka did not confirm the message within {self.settings.delivery_timeout}s",
            )
            for m in messages
        ]
        if left or any(not r.ok for r in result):
            # After a failure the next batch starts with a new producer: unconfirmed
            # messages are dropped from this one (they are retried from the outbox),
            # and an idempotent producer that timed out or lost its producer id on a
            # restarted broker may never recover.
            self._discard_producer()
        return result

    def check(self) -> None:
        producer, _ = self._ready_producer()
        try:
            producer.list_topics(timeout=self.settings.connect_timeout)
        except _kafka().KafkaException as exc:
            raise TransportUnavailable(f"Kafka is not reachable: {exc}") from exc

    def close(self) -> None:
        producer, self._producer, self._errors = self._producer, None, None
        if producer is not None:
            try:
                producer.flush(self.settings.connect_timeout)
            except Exception:
                logger.debug("flushing the Kafka producer failed", exc_info=True)

    # ------------------------------------------------------------------ consuming

    def subscribe(
        self, *, group: str, sources: Sequence[str], event_types: Sequence[str]
    ) -> KafkaSubscription:
        return KafkaSubscription(
            self.settings,
            group=group,
            topics=list(sources) or [self.settings.topic],
            parked_topic=self.settings.parked_topic or f"{group}.parked",
        )


class KafkaSubscription(Subscription):
    """Read ``topics`` in consumer group ``group``; commit each message's offset after
    its transaction committed."""

    def __init__(
        self, settings: KafkaOptions, *, group: str, topics: list[str], parked_topic: str
    ) -> None:
        self.settings = settings
        self.group = group
        self.topics = topics
        self.parked_topic = parked_topic
        self._consumer: Any = None
        self._errors = _ErrorLog("consumer")
        self._producer: Any = None
        self._producer_errors: _ErrorLog | None = None

    def describe(self) -> str:
        topics = ", ".join(repr(t) for t in self.topics)
        return (
            f"topic(s) {topics} in consumer group {self.group!r} "
            f"(parked messages: topic {self.parked_topic!r})"
        )

    def open(self) -> None:
        kafka = _kafka()
        self._errors = _ErrorLog("consumer")
        config = {
            "bootstrap.servers": self.settings.bootstrap_servers,
            "auto.offset.reset": "earliest",
            "socket.connection.setup.timeout.ms": max(
                1000, int(self.settings.connect_timeout * 1000)
            ),
            "log_level": 2,
            **self.settings.consumer_config,
            "group.id": self.group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "error_cb": self._errors,
            "logger": client_logger,
        }
        try:
            self._consumer = kafka.Consumer(config)
            self._consumer.subscribe(self.topics)
        except kafka.KafkaException as exc:
            self.close()
            raise TransportError(f"the Kafka consumer cannot start: {exc}") from exc

    def receive(self, timeout: float) -> Received | None:
        kafka = _kafka()
        if self._consumer is None:
            raise TransportUnavailable("the subscription is not open")
        try:
            record = self._consumer.poll(timeout)
        except kafka.KafkaException as exc:
            self.close()
            raise TransportUnavailable(f"Kafka consumer failed: {exc}") from exc
        if self._errors.fatal is not None:
            error, self._errors.fatal = self._errors.fatal, None
            self.close()
            raise TransportUnavailable(f"Kafka consumer failed: {error}")
        if record is None:
            return None
        error = record.error()
        if error is not None:
            if error.fatal():
                self.close()
                raise TransportUnavailable(f"Kafka consumer failed: {error}")
            if error.code() != kafka.KafkaError._PARTITION_EOF:
                self._errors(error)
            return None
        source = (
            f"topic {record.topic()!r}, partition {record.partition()}, offset {record.offset()}"
        )
        try:
            headers = wire.text_headers(dict(record.headers() or []))
            if wire.KEY not in headers and record.key() is not None:
                headers[wire.KEY] = record.key().decode()
            envelope = wire.read_envelope(record.value() or b"", headers)
        except (UndecodableMessage, UnicodeDecodeError) as exc:
            return Received(envelope=None, problem=str(exc), source=source, handle=record)
        return Received(envelope=envelope, source=source, handle=record)

    def ack(self, message: Received) -> None:
        kafka = _kafka()
        record = message.handle
        position = kafka.TopicPartition(record.topic(), record.partition(), record.offset() + 1)
        try:
            self._consumer.commit(offsets=[position], asynchronous=False)
        except kafka.KafkaException as exc:
            # The partition was reassigned, or the broker is away: the message will be
            # delivered again and the inbox skips it. Later commits supersede this one.
            logger.warning(
                "committing the offset of %s failed: %s",
                message.source,
                exc,
                extra={"group": self.group},
            )

    def park(self, message: Received, reason: str) -> None:
        kafka = _kafka()
        record = message.handle
        if self._producer is None or (
            self._producer_errors is not None and self._producer_errors.fatal is not None
        ):
            self._producer, self._producer_errors = _producer(self.settings)
        headers = list(record.headers() or [])
        headers += [
            (k, v.encode())
            for k, v in wire.parked_headers(
                {}, reason=reason, group=self.group, source=message.source
            ).items()
        ]
        outcome: list[Any] = []
        try:
            self._producer.produce(
                self.parked_topic,
                value=record.value(),
                key=record.key(),
                headers=headers,
                on_delivery=lambda error, _record: outcome.append(error),
            )
            self._producer.flush(self.settings.delivery_timeout + 5)
        except kafka.KafkaException as exc:
            outcome.append(exc)
        if not outcome or outcome[0] is not None:
            self._producer = None
            # Not committed: the subscription is re-opened and the message comes again,
            # so that no later offset is committed past it.
            self.close()
            raise TransportUnavailable(
                f"parking {message.source} in {self.parked_topic!r} failed: "
                f"{outcome[0] if outcome else 'no confirmation'}"
            )
        self.ack(message)

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception:
                logger.debug("closing the Kafka consumer failed", exc_info=True)
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.flush(self.settings.connect_timeout)
            except Exception:
                logger.debug("flushing the Kafka producer failed", exc_info=True)
