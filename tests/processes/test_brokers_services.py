"""Transports with real brokers: two services, each with its own database, talking through
RabbitMQ or Kafka.

Service A is this test process and its test database: it commits orders with their
outbox messages, and runs ``dispatch_outbox`` as a child process. Service B is the
same project on another database (a second SQLite file, or a second PostgreSQL
database), migrated by ``manage.py migrate`` and running ``consume_events`` as a child
process; the billing subscriber writes one invoice per order there.

Every test runs against both brokers. Crashes happen at named fault points
(``ORDERS_FAULT``, see testproject/faults.py), never after a hopeful sleep."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from outbox import unit_of_work
from outbox.models import OutboxMessage
from outbox.transports import wire
from outbox.types import MessageStatus
from testproject.orders.events import InvoiceIssued, OrderPlaced
from testproject.orders.services import place_order
from tests.support.brokers import (
    EACH_BROKER,
    Broker,
    ManageCommand,
    Processes,
    ServiceDatabase,
    broker,
    read_kafka_topic,
    transport_env,
    unique,
)
from tests.support.procs import database_url

# Each test in its broker's xdist group (EACH_BROKER): one stops and restarts it.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KAFKA_CONSUMER = {
    # Short sessions make group joins and the take-over after a SIGKILL quick.
    "session.timeout.ms": 2000,
    "heartbeat.interval.ms": 200,
    "topic.metadata.refresh.interval.ms": 1000,
}


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}


@pytest.fixture(params=EACH_BROKER)
def real_broker(request: pytest.FixtureRequest) -> Broker:
    return broker(request.param)


@pytest.fixture(scope="module")
def service_b(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceDatabase]:
    with django_db_blocker.unblock():
        a_url = database_url()
    db = ServiceDatabase.beside(a_url, tmp_path_factory.mktemp("service-b"))
    try:
        db.migrate()
        yield db
    finally:
        db.drop()


@dataclass
class Services:
    """Service A (this process and child dispatchers) and service B (child consumers)
    around one broker, with names of their own for this test."""

    broker: Broker
    b: ServiceDatabase
    procs: Processes
    tag: str = field(default_factory=lambda: unique("O"))
    group: str = field(default_factory=lambda: unique("billing"))

    def __post_init__(self) -> None:
        if self.broker.kind == "rabbitmq":
            self.options: dict[str, Any] = {"exchange": unique("orders"), "connect_timeout": 2}
            self.parked = f"{self.group}.parked"
        else:
            self.options = {
                "topic": unique("orders"),
                "delivery_timeout": 5,
                "connect_timeout": 2,
                "consumer_config": KAFKA_CONSUMER,
            }
            self.parked = f"{self.group}.parked"

    def env(self, **extra: str) -> dict[str, str]:
        return {**transport_env(self.broker, self.options), **extra}

    def consumer(self, *args: str, **env: str) -> ManageCommand:
        proc = self.procs.start(
            "consume_events",
            "--group",
            self.group,
            *args,
            env=self.env(**env),
            database_url=self.b.url,
        )
        return proc

    def ready_consumer(self, *args: str, **env: str) -> ManageCommand:
        proc = self.consumer(*args, **env)
        proc.wait_for_output("\nready ")
        return proc

    def dispatcher(self, *args: str, **env: str) -> ManageCommand:
        return self.procs.start(
            "dispatch_outbox", *args, env=self.env(**env), database_url=database_url()
        )

    def place(self, count: int, start: int = 0) -> list[str]:
        numbers = [f"{self.tag}-{n:03}" for n in range(start, start + count)]
        for number in numbers:
            place_order(number, Decimal("10.00"))
        return numbers

    def placed(self) -> Any:
        return OutboxMessage.objects.filter(
            event_type=OrderPlaced.event_name, key__startswith=self.tag
        )

    def placed_ids(self) -> set[str]:
        return {str(m) for m in self.placed().values_list("message_id", flat=True)}

    def handled_in_b(self) -> set[str]:
        return self.b.inbox_ids(self.group)

    def assert_each_handled_once(self, count: int) -> None:
        """B holds one invoice, one inbox record and one subscriber run per message,
        and the handler's own outbox message, for exactly A's messages."""
        ids = self.placed_ids()
        assert len(ids) == count
        assert not self.placed().exclude(status=MessageStatus.SENT).exists()
        assert self.handled_in_b() == ids
        invoices = self.b.invoices(self.tag)
        assert len(invoices) == count
        assert {message_id for _, message_id in invoices} == ids
        runs = self.b.deliveries(ids)
        assert sorted(m for m, _ in runs) == sorted(ids), "a message was handled twice"
        assert all(fresh for _, fresh in runs)
        numbers = {number for number, _ in invoices}
        assert self.b.outbox_count(InvoiceIssued.event_name, numbers) == count


@pytest.fixture
def services(real_broker: Broker, service_b: ServiceDatabase, tmp_path: Path) -> Iterator[Services]:
    procs = Processes(tmp_path)
    try:
        yield Services(real_broker, service_b, procs)
    finally:
        procs.close()


# --------------------------------------------------------------------------- tests


def test_every_message_is_handled_exactly_once_in_the_other_service(services: Services):
    """A commits 20 orders; its dispatcher publishes them in batches of 7; B's consumer
    handles each once in B's database and stops cleanly on SIGTERM."""
    consumer = services.ready_consumer()
    services.place(20)
    dispatcher = services.dispatcher("--burst", "--batch-size", "7")
    assert dispatcher.wait() == 0, dispatcher.output
    assert "sent 20" in dispatcher.output
    consumer.wait_until(lambda: len(services.handled_in_b()) == 20, "20 messages handled in B")
    assert consumer.terminate() == 0, consumer.output
    assert "stopped: received 20, handled 20, duplicates skipped 0" in consumer.output
    services.assert_each_handled_once(20)


def test_unreadable_and_unknown_messages_are_parked_and_the_rest_flows(services: Services):
    """Messages the consumer cannot read, or whose type no class is registered for,
    are parked with the reason; a registered type without a subscriber here is
    skipped; the orders published around them are handled."""
    consumer = services.ready_consumer()
    probe = probe_for(services)
    probe.publish(b"{not json", message_id=new_id(), event_type=OrderPlaced.event_name)
    probe.publish(b"{}", message_id=None, event_type=OrderPlaced.event_name)
    probe.publish(b"{}", message_id=new_id(), event_type="nobody.knows_this")
    probe.publish(
        b'{"number": "X", "total": "1"}', message_id=new_id(), event_type=InvoiceIssued.event_name
    )
    services.place(3)
    dispatcher = services.dispatcher("--burst")
    assert dispatcher.wait() == 0, dispatcher.output
    consumer.wait_until(lambda: len(services.handled_in_b()) == 3, "3 orders handled in B")
    consumer.wait_until(lambda: consumer.output.count("\nparked ") == 3, "3 messages parked")
    assert consumer.terminate() == 0, consumer.output
    assert "skipped 1, parked 3" in consumer.output
    services.assert_each_handled_once(3)

    parked = probe.parked(3)
    reasons = sorted(headers[wire.PARKED_REASON] for headers, _ in parked)
    assert "the payload is not JSON" in reasons[0] + reasons[1] + reasons[2]
    assert any("has no message id" in r for r in reasons)
    assert any("unknown event type 'nobody.knows_this'" in r for r in reasons)
    assert {headers[wire.PARKED_BY] for headers, _ in parked} == {services.group}
    assert sorted(body for _, body in parked) == sorted([b"{not json", b"{}", b"{}"])


def test_while_the_broker_is_down_messages_wait_and_none_is_lost_or_doubled(services: Services):
    """The broker stops while A keeps committing: the new messages stay Pending with
    the error recorded. Once it is back, the dispatcher and the consumer reconnect by
    themselves and every message is handled exactly once in B."""
    consumer = services.ready_consumer()
    dispatcher = services.dispatcher(
        OUTBOX_POLL_INTERVAL="0.1", OUTBOX_RETRY_BASE_DELAY="0.2", OUTBOX_MAX_ATTEMPTS="50"
    )
    dispatcher.wait_for_output("started transport")
    services.place(5)
    consumer.wait_until(lambda: len(services.handled_in_b()) == 5, "the first 5 handled in B")

    with services.broker.stopped():
        services.place(5, start=5)
        later = services.placed().filter(key__gte=f"{services.tag}-005")

        def failed_while_down() -> bool:
            rows = list(later.values_list("status", "attempts", "last_error"))
            return len(rows) == 5 and all(
                status == MessageStatus.PENDING and attempts >= 1 and error
                for status, attempts, error in rows
            )

        dispatcher.wait_until(failed_while_down, "the new messages to fail and wait", timeout=60)
        assert len(services.handled_in_b()) == 5

    consumer.wait_until(lambda: len(services.handled_in_b()) == 10, "all 10 handled in B", 90)
    dispatcher.wait_until(
        lambda: not services.placed().exclude(status=MessageStatus.SENT).exists(), "all sent"
    )
    assert dispatcher.terminate() == 0, dispatcher.output
    assert consumer.terminate() == 0, consumer.output
    services.assert_each_handled_once(10)


def test_a_consumer_killed_after_commit_before_ack_has_the_redelivery_skipped(
    services: Services,
):
    """The consumer SIGKILLs itself right after the third message's transaction
    committed and before it was acknowledged. The broker delivers that message again
    to the restarted consumer, whose inbox skips it: handled once in B."""
    victim = services.ready_consumer(ORDERS_FAULT="outbox.consumer.committed@3:kill")
    services.place(6)
    dispatcher = services.dispatcher("--burst")
    assert dispatcher.wait() == 0, dispatcher.output
    assert victim.wait() == -signal.SIGKILL, victim.output

    committed = services.handled_in_b()
    acknowledged = {
        line.split()[1] for line in victim.output.splitlines() if line.startswith("handled ")
    }
    assert len(committed) == 3, victim.output
    assert len(acknowledged) == 2, victim.output
    (unacknowledged,) = committed - acknowledged

    survivor = services.consumer()
    survivor.wait_until(lambda: len(services.handled_in_b()) == 6, "all 6 handled in B")
    survivor.wait_for_output(f"duplicate {unacknowledged}")
    assert survivor.terminate() == 0, survivor.output
    assert "duplicates skipped 1" in survivor.output
    services.assert_each_handled_once(6)


def test_each_keys_messages_reach_the_other_service_in_stored_order(services: Services):
    """A stores 4 keys x 8 orders, interleaved. A first dispatcher, in batches of 3,
    is killed after the broker confirmed its second batch and before it was recorded;
    a second one publishes that batch again once its lease ran out, and the rest.
    B's one consumer handles each key's orders in stored order: the inbox skips the
    re-published copies and no key's next message overtook them (Kafka keeps the order
    through the key's partition, RabbitMQ through a queue with one consumer)."""
    consumer = services.ready_consumer()
    keys = [f"{services.tag}-k{k}" for k in range(4)]
    stored: dict[str, list[str]] = {key: [] for key in keys}
    for n in range(8):
        with unit_of_work() as uow:
            for key in keys:
                number = f"{key}-{n:02}"
                uow.add_integration_event(
                    OrderPlaced(number, Decimal("1.00"), timezone.now()), key=key
                )
                stored[key].append(number)
    retries = {"OUTBOX_LEASE_SECONDS": "1", "OUTBOX_RETRY_BASE_DELAY": "0.05"}
    victim = services.dispatcher(
        "--batch-size", "3", ORDERS_FAULT="outbox.dispatcher.published@2:kill", **retries
    )
    assert victim.wait() == -signal.SIGKILL, victim.output
    survivor = services.dispatcher("--batch-size", "3", OUTBOX_POLL_INTERVAL="0.1", **retries)
    consumer.wait_until(lambda: len(services.handled_in_b()) == 32, "32 orders handled in B", 90)
    survivor.wait_until(
        lambda: not services.placed().exclude(status=MessageStatus.SENT).exists(), "all sent"
    )
    assert survivor.terminate() == 0, survivor.output
    assert consumer.terminate() == 0, consumer.output

    handled = [number for number, fresh in services.b.handled_orders(services.tag) if fresh]
    assert len(handled) == 32
    for key in keys:
        assert [n for n in handled if n.startswith(f"{key}-")] == stored[key]


# --------------------------------------------------------------------------- raw access


def new_id() -> str:
    return str(uuid.uuid4())


def probe_for(services: Services) -> Any:
    if services.broker.kind == "rabbitmq":
        return RabbitProbe(services)
    return KafkaProbe(services)


class RabbitProbe:
    """Publishes straight into the consumer's queue and reads its parking queue."""

    def __init__(self, services: Services) -> None:
        import pika

        self.pika = pika
        self.services = services
        self.connection = pika.BlockingConnection(pika.URLParameters(services.broker.address))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def publish(self, body: bytes, *, message_id: str | None, event_type: str) -> None:
        properties = self.pika.BasicProperties(
            message_id=message_id, type=event_type, delivery_mode=2, headers={"origin": "test"}
        )
        self.channel.basic_publish("", self.services.group, body, properties, mandatory=True)

    def parked(self, count: int) -> list[tuple[dict[str, str], bytes]]:
        found = []
        for _ in range(count):
            method, properties, body = self.channel.basic_get(self.services.parked, auto_ack=True)
            assert method is not None, f"only {len(found)} parked message(s)"
            found.append((wire.text_headers(properties.headers), body))
        self.connection.close()
        return found


class KafkaProbe:
    """Produces straight into the topic and reads the parking topic (no group)."""

    def __init__(self, services: Services) -> None:
        import confluent_kafka

        self.kafka = confluent_kafka
        self.services = services
        self.producer = confluent_kafka.Producer({"bootstrap.servers": services.broker.address})

    def publish(self, body: bytes, *, message_id: str | None, event_type: str) -> None:
        headers = {"origin": "test", wire.EVENT_TYPE: event_type}
        if message_id:
            headers[wire.MESSAGE_ID] = message_id
        self.producer.produce(
            self.services.options["topic"],
            value=body,
            headers=[(k, v.encode()) for k, v in headers.items()],
        )
        assert self.producer.flush(10) == 0

    def parked(self, count: int) -> list[tuple[dict[str, str], bytes]]:
        records = read_kafka_topic(self.services.broker.address, self.services.parked, count)
        return [(wire.text_headers(dict(r.headers() or [])), r.value()) for r in records]
