"""What the RabbitMQ and Kafka transports put on a real broker, and what they
report when the broker refuses a message or cannot be reached."""

from __future__ import annotations

import dataclasses
import socket
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from outbox.exceptions import TransportUnavailable
from outbox.transports import wire
from outbox.transports.kafka import KafkaTransport
from outbox.transports.rabbitmq import RabbitMQTransport
from outbox.types import Envelope
from tests.support.brokers import broker, read_kafka_topic, require_client, unique, uses_broker

pytestmark = [pytest.mark.slow]


def envelope(key: str = "O-1", n: int = 0, **headers: str) -> Envelope:
    return Envelope(
        message_id=uuid.uuid4(),
        event_type="orders.placed",
        payload_json=f'{{"number": "{key}", "n": {n}}}',
        key=key,
        headers=headers,
        created_at=datetime(2026, 11, 1, 12, 0, tzinfo=UTC),
        attempt=1,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- RabbitMQ


@pytest.fixture
def rabbitmq() -> Any:
    address = broker("rabbitmq").address
    import pika  # the rabbitmq extra: broker() skipped the test without it

    connection = pika.BlockingConnection(pika.URLParameters(address))
    yield address, connection.channel()
    connection.close()


@uses_broker("rabbitmq")
def test_rabbitmq_publishes_persistent_messages_with_id_type_and_headers(rabbitmq):
    address, channel = rabbitmq
    exchange, queue = unique("ex"), unique("q")
    transport = RabbitMQTransport(url=address, exchange=exchange)
    transport.check()  # declares the exchange
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, routing_key="orders.placed")
    sent = [envelope("O-1", tenant="acme"), envelope("O-2")]
    try:
        reports = transport.publish(sent)
    finally:
        transport.close()
    assert [r.ok for r in reports] == [True, True]
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert body == sent[0].payload_json.encode()
    assert method.routing_key == "orders.placed"
    assert properties.message_id == str(sent[0].message_id)
    assert properties.type == "orders.placed"
    assert properties.delivery_mode == 2
    assert properties.content_type == "application/json"
    headers = wire.text_headers(properties.headers)
    assert headers["tenant"] == "acme"
    assert headers[wire.KEY] == "O-1"
    assert headers[wire.CREATED_AT] == "2026-11-01T12:00:00+00:00"
    assert channel.basic_get(queue, auto_ack=True)[0] is not None


@uses_broker("rabbitmq")
def test_rabbitmq_reports_a_message_no_queue_is_bound_for_as_failed(rabbitmq):
    address, _ = rabbitmq
    transport = RabbitMQTransport(url=address, exchange=unique("ex"))
    try:
        (report,) = transport.publish([envelope()])
    finally:
        transport.close()
    assert not report.ok
    assert "no queue is bound" in report.error
    assert not report.permanent  # retried: a consumer may declare its queue later


def test_rabbitmq_unreachable_is_reported_as_unavailable():
    require_client("rabbitmq")
    transport = RabbitMQTransport(url=f"amqp://guest:guest@127.0.0.1:{closed_port()}/")
    with pytest.raises(TransportUnavailable, match="cannot connect to RabbitMQ"):
        transport.check()
    with pytest.raises(TransportUnavailable):
        transport.publish([envelope()])


# --------------------------------------------------------------------------- Kafka


@uses_broker("kafka")
def test_kafka_publishes_with_the_outbox_key_so_each_key_keeps_its_order(
    monkeypatch: pytest.MonkeyPatch,
):
    address = broker("kafka").address
    import confluent_kafka  # the kafka extra: broker() skipped the test without it

    configs: list[dict[str, Any]] = []
    real_producer = confluent_kafka.Producer

    def recording_producer(config: dict[str, Any]) -> Any:
        configs.append(config)
        return real_producer(config)

    monkeypatch.setattr(confluent_kafka, "Producer", recording_producer)
    topic = unique("orders")
    transport = KafkaTransport(bootstrap_servers=address, topic=topic, delivery_timeout=10)
    sent = [envelope(key, n, tenant="acme") for n in range(4) for key in ("A", "B")]
    try:
        reports = transport.publish(sent)
    finally:
        transport.close()
    assert all(r.ok for r in reports), reports
    assert configs[0]["enable.idempotence"] is True
    assert configs[0]["acks"] == "all"

    records = read_kafka_topic(address, topic, len(sent))
    by_key: dict[bytes, list[tuple[int, str]]] = {}
    for record in sorted(records, key=lambda r: (r.partition(), r.offset())):
        headers = wire.text_headers(dict(record.headers()))
        assert headers["tenant"] == "acme"
        by_key.setdefault(record.key(), []).append((record.partition(), headers[wire.MESSAGE_ID]))
    for key in (b"A", b"B"):
        partitions = {p for p, _ in by_key[key]}
        assert len(partitions) == 1, "one key, one partition"
        assert [m for _, m in by_key[key]] == [
            str(e.message_id) for e in sent if e.key.encode() == key
        ]


def test_kafka_unreachable_is_reported_as_unavailable():
    require_client("kafka")
    transport = KafkaTransport(bootstrap_servers=f"127.0.0.1:{closed_port()}", connect_timeout=0.5)
    with pytest.raises(TransportUnavailable, match="Kafka is not reachable"):
        transport.check()
    with pytest.raises(TransportUnavailable):
        transport.publish([envelope()])
    transport.close()


def test_each_transports_options_are_read_from_its_options_dataclass():
    from outbox.transports.kafka import OPTIONS as KAFKA_OPTIONS
    from outbox.transports.kafka import KafkaOptions
    from outbox.transports.rabbitmq import OPTIONS as RABBITMQ_OPTIONS
    from outbox.transports.rabbitmq import RabbitMQOptions

    assert list(KAFKA_OPTIONS) == [f.name for f in dataclasses.fields(KafkaOptions)]
    assert list(RABBITMQ_OPTIONS) == [f.name for f in dataclasses.fields(RabbitMQOptions)]
    # Required: no default. A float takes an int, a mapping is a dict, None is no value.
    assert KAFKA_OPTIONS["bootstrap_servers"] == ((str,), True)
    assert KAFKA_OPTIONS["delivery_timeout"] == ((int, float), False)
    assert KAFKA_OPTIONS["producer_config"] == ((dict,), False)
    assert RABBITMQ_OPTIONS["queue"] == ((str,), False)
    assert RABBITMQ_OPTIONS["declare"] == ((bool,), False)
    problems = wire.option_problems(
        {"delivery_timeout": "soon", "topik": "x"}, wire.option_spec(KafkaOptions)
    )
    assert problems == [
        "unknown option 'topik'",
        "'bootstrap_servers' is required",
        "'delivery_timeout' must be int or float, not str",
    ]
    checked = KafkaTransport.check_options({"delivery_timeout": "soon"})
    assert "'delivery_timeout' must be int or float, not str" in checked
