"""The consumer engine behind consume_events, the wire format and the broker
transports' configuration — without a broker: a scripted subscription feeds the
engine, on SQLite and PostgreSQL."""

from __future__ import annotations

import collections
import sys
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection

from outbox import IntegrationEvent, event_bus
from outbox.checks import check_outbox_settings
from outbox.consumer import EventConsumer, handled_event_types
from outbox.events import registered_events
from outbox.exceptions import (
    MissingBrokerClient,
    OutboxConfigurationError,
    TransportError,
    TransportUnavailable,
    UndecodableMessage,
)
from outbox.models import InboxMessage
from outbox.testing import fault_at
from outbox.transports import get_transport, transport_class, wire
from outbox.transports.base import Received, Subscription
from outbox.types import Envelope
from testproject.orders.events import InvoiceIssued, OrderPlaced
from testproject.orders.models import Delivery, Invoice

GROUP = "billing-service"


class ScriptedSubscription(Subscription):
    """Hands out the scripted messages (or raises scripted errors), records what the
    engine acknowledges and parks, and stops the engine when the script is done."""

    def __init__(self, script: Iterable[Received | BaseException]) -> None:
        self.script = collections.deque(script)
        self.consumer: EventConsumer | None = None
        self.acked: list[Received] = []
        self.parked: list[tuple[Received, str]] = []
        self.paused: list[float] = []
        self.opened = 0
        self.closed = 0
        self.open_error: BaseException | None = None
        self.on_pause: Callable[[], None] | None = None

    def open(self) -> None:
        if self.open_error is not None:
            raise self.open_error
        self.opened += 1

    def receive(self, timeout: float) -> Received | None:
        if not self.script:
            assert self.consumer is not None
            self.consumer.stop()
            return None
        item = self.script.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def ack(self, message: Received) -> None:
        # Acknowledged only once the handler's work is committed and visible.
        assert not connection.in_atomic_block
        self.acked.append(message)

    def park(self, message: Received, reason: str) -> None:
        self.parked.append((message, reason))

    def pause(self, seconds: float) -> None:
        self.paused.append(seconds)
        if self.on_pause is not None:
            self.on_pause()

    def close(self) -> None:
        self.closed += 1

    def describe(self) -> str:
        return "a scripted subscription"


def received(
    event_type: str = OrderPlaced.event_name,
    payload: str | None = None,
    *,
    message_id: uuid.UUID | None = None,
    number: str = "O-1",
) -> Received:
    payload = (
        payload
        or f'{{"number": "{number}", "total": "12.50", "placed_at": "2026-11-01T10:00:00Z"}}'
    )
    envelope = Envelope(
        message_id=message_id or uuid.uuid4(),
        event_type=event_type,
        payload_json=payload,
        key=number,
        created_at=datetime(2026, 11, 1, tzinfo=UTC),
        attempt=1,
    )
    return Received(envelope=envelope, source="scripted")


def run(
    *script: Received | BaseException, **options: Any
) -> tuple[EventConsumer, ScriptedSubscription]:
    subscription = ScriptedSubscription(script)
    options.setdefault("retry_delay", 0.01)
    consumer = EventConsumer(GROUP, subscription=subscription, **options)
    subscription.consumer = consumer
    consumer.run()
    return consumer, subscription


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}


# --------------------------------------------------------------------------- handling


@pytest.mark.django_db(transaction=True)
def test_a_new_message_runs_its_subscribers_in_one_transaction_then_is_acknowledged():
    message = received(number="O-7")
    consumer, subscription = run(message)
    assert subscription.acked == [message]
    assert consumer.stats.handled == 1
    invoice = Invoice.objects.get()
    assert (invoice.order_number, invoice.total) == ("O-7", Decimal("12.50"))
    assert invoice.message_id == str(message.envelope.message_id)  # type: ignore[union-attr]
    assert set(InboxMessage.objects.values_list("consumer", flat=True)) == {GROUP, "billing"}
    assert subscription.opened == 1
    assert subscription.closed == 1


@pytest.mark.django_db(transaction=True)
def test_a_redelivery_is_skipped_by_the_inbox_and_acknowledged():
    first = received()
    again = Received(envelope=first.envelope, source="scripted, redelivered")
    consumer, subscription = run(first, again)
    assert subscription.acked == [first, again]
    assert (consumer.stats.handled, consumer.stats.duplicate) == (1, 1)
    assert Invoice.objects.count() == 1
    assert Delivery.objects.count() == 1  # the subscriber ran once


@pytest.mark.django_db(transaction=True)
def test_unreadable_and_unknown_messages_are_parked_with_the_reason():
    unreadable = Received(envelope=None, problem="the message has no message id", source="q")
    unknown = received("nobody.knows_this", "{}")
    not_json = received(payload="{not json")
    wrong_fields = received(payload='{"number": "O-1", "placed_at": "yesterday"}')
    consumer, subscription = run(unreadable, unknown, not_json, wrong_fields)
    reasons = [reason for _, reason in subscription.parked]
    assert reasons[0] == "undecodable message: the message has no message id"
    assert reasons[1].startswith("unknown event type 'nobody.knows_this'")
    assert "the payload is not JSON" in reasons[2]
    assert "cannot read the payload" in reasons[3]
    assert consumer.stats.parked == 4
    assert not subscription.acked  # parking acknowledges by itself
    assert not InboxMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_registered_type_without_a_subscriber_here_is_skipped():
    message = received(InvoiceIssued.event_name, '{"number": "O-1", "total": "1"}')
    consumer, subscription = run(message)
    assert subscription.acked == [message]
    assert consumer.stats.skipped == 1
    assert not subscription.parked
    assert not InboxMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_failing_subscriber_rolls_back_each_attempt_then_the_message_is_parked():
    with fault_at("orders.billing.invoice_created", RuntimeError("printer on fire")) as seen:
        consumer, subscription = run(received(), max_attempts=3, retry_delay=0.5)
    assert len(seen) == 3
    ((_, reason),) = subscription.parked
    assert reason.startswith("handling failed 3 time(s): HandlerFailed:")
    assert "RuntimeError: printer on fire" in reason
    assert consumer.stats.retries == 2
    assert not subscription.acked
    assert not Invoice.objects.exists()
    assert not InboxMessage.objects.exists()
    assert sum(subscription.paused) == pytest.approx(0.5 + 1.0, rel=0.11)  # backoff doubles


@pytest.mark.django_db(transaction=True)
def test_a_subscriber_failing_once_succeeds_on_the_retry():
    calls = collections.Counter[str]()

    def first_time(context: dict[str, Any]) -> bool:
        calls["seen"] += 1
        return calls["seen"] == 1

    with fault_at("orders.billing.invoice_created", RuntimeError("once"), when=first_time):
        consumer, subscription = run(received())
    assert consumer.stats.handled == 1
    assert consumer.stats.retries == 1
    assert Invoice.objects.count() == 1
    assert len(subscription.acked) == 1


@pytest.mark.django_db(transaction=True)
def test_database_errors_are_retried_until_they_pass_and_never_park():
    calls = collections.Counter[str]()

    def first_five(context: dict[str, Any]) -> bool:
        calls["seen"] += 1
        return calls["seen"] <= 5

    error = OperationalError("server closed the connection unexpectedly")
    with fault_at("orders.billing.inbox_recorded", error, when=first_five):
        consumer, subscription = run(received(), max_attempts=2)
    assert not subscription.parked
    assert consumer.stats.handled == 1
    assert consumer.stats.retries == 5
    assert Invoice.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_stopping_while_a_message_waits_for_a_retry_leaves_it_unacknowledged():
    subscription = ScriptedSubscription([received()])
    consumer = EventConsumer(GROUP, subscription=subscription, retry_delay=5)
    subscription.consumer = consumer
    subscription.on_pause = consumer.stop  # SIGTERM arrives during the backoff
    with fault_at("orders.billing.inbox_recorded", OperationalError("database is locked")):
        stats = consumer.run()
    assert stats.abandoned == 1
    assert not subscription.acked
    assert not subscription.parked
    assert not InboxMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_lost_broker_connection_reopens_the_subscription_and_goes_on():
    consumer, subscription = run(
        TransportUnavailable("connection reset"), received(), reconnect_delay=0.01
    )
    assert subscription.opened == 2
    assert consumer.stats.reconnects == 1
    assert consumer.stats.handled == 1


@pytest.mark.django_db(transaction=True)
def test_a_broker_refusing_the_configuration_stops_the_consumer():
    subscription = ScriptedSubscription([])
    subscription.open_error = TransportError("queue declared with other arguments")
    consumer = EventConsumer(GROUP, subscription=subscription)
    with pytest.raises(TransportError, match="other arguments"):
        consumer.run()
    assert subscription.closed == 1


def test_the_handled_event_types_are_the_subscribed_integration_events():
    handled = handled_event_types()
    assert OrderPlaced.event_name in handled
    assert InvoiceIssued.event_name not in handled  # registered, nobody subscribes
    assert all(issubclass(registered_events()[name], IntegrationEvent) for name in handled)
    assert all(event_bus.subscribers(registered_events()[name]) for name in handled)
    assert handled_event_types([OrderPlaced.event_name]) == [OrderPlaced.event_name]
    with pytest.raises(OutboxConfigurationError, match=r"'nobody\.knows' is not registered"):
        handled_event_types(["nobody.knows"])
    with pytest.raises(OutboxConfigurationError, match="has no subscriber here"):
        handled_event_types([InvoiceIssued.event_name])


# --------------------------------------------------------------------------- wire format


def test_an_envelope_travels_through_the_headers_unchanged():
    envelope = Envelope(
        message_id=uuid.uuid4(),
        event_type="orders.placed",
        payload_json='{"number":"Ø-1"}',
        key="Ø-1",
        headers={"tenant": "acme", "ledon-key": "forged"},
        created_at=datetime(2026, 11, 1, 9, 30, 0, 123456, tzinfo=UTC),
        attempt=3,
    )
    headers = wire.envelope_headers(envelope)
    assert headers[wire.KEY] == "Ø-1"  # a user header cannot overwrite the app's
    as_bytes = {name: value.encode() for name, value in headers.items()}
    read = wire.read_envelope(envelope.payload_json.encode(), wire.text_headers(as_bytes))
    assert read == Envelope(
        message_id=envelope.message_id,
        event_type="orders.placed",
        payload_json='{"number":"Ø-1"}',
        key="Ø-1",
        headers={"tenant": "acme"},
        created_at=envelope.created_at,
        attempt=3,
    )


@pytest.mark.parametrize(
    ("body", "headers", "problem"),
    [
        (b"{}", {}, "has no message id"),
        (b"{}", {wire.MESSAGE_ID: "42"}, "'42' is not a UUID"),
        (b"{}", {wire.MESSAGE_ID: str(uuid.UUID(int=1))}, "has no event type"),
        (b"\xff", {wire.MESSAGE_ID: str(uuid.UUID(int=1)), wire.EVENT_TYPE: "a"}, "not UTF-8"),
    ],
)
def test_a_message_not_in_the_wire_format_is_refused_with_the_reason(body, headers, problem):
    with pytest.raises(UndecodableMessage, match=problem):
        wire.read_envelope(body, headers)


def test_header_values_are_read_as_text():
    assert wire.text_headers({"a": b"x", "b": "y", "c": 3, "d": None}) == {
        "a": "x",
        "b": "y",
        "c": "3",
    }
    with pytest.raises(UndecodableMessage, match="header 'a' is not UTF-8"):
        wire.text_headers({"a": b"\xff"})


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("name", "module", "options"),
    [
        ("rabbitmq", "pika", {"url": "amqp://localhost"}),
        ("kafka", "confluent_kafka", {"bootstrap_servers": "localhost:9092"}),
    ],
)
def test_a_missing_broker_client_names_the_extra_to_install(
    settings: Any, monkeypatch: pytest.MonkeyPatch, name: str, module: str, options: Any
):
    monkeypatch.setitem(sys.modules, module, None)
    settings.OUTBOX = {"TRANSPORT": name, "TRANSPORT_OPTIONS": options}
    expected = f"pip install 'django-ledon[{name}]'"
    with pytest.raises(MissingBrokerClient, match=expected.replace("[", r"\[")):
        transport_class(name)(**options)
    with pytest.raises(OutboxConfigurationError, match=expected.replace("[", r"\[")):
        get_transport()
    errors = [e for e in check_outbox_settings() if e.id == "outbox.E003"]
    assert len(errors) == 1
    assert expected in errors[0].msg


@pytest.mark.parametrize(
    ("name", "options", "problem"),
    [
        ("rabbitmq", {}, "'url' is required"),
        ("rabbitmq", {"url": "amqp://h", "prefetch": 0}, "'prefetch' must be from 1 to 65535"),
        ("rabbitmq", {"url": "amqp://h", "mandatory": "yes"}, "'mandatory' must be bool"),
        ("rabbitmq", {"url": "amqp://h", "exchange_type": "x"}, "'exchange_type' must be one"),
        ("rabbitmq", {"url": "amqp://h", "durable": True}, "unknown option 'durable'"),
        ("kafka", {}, "'bootstrap_servers' is required"),
        ("kafka", {"bootstrap_servers": "h", "delivery_timeout": 0}, "must be positive"),
        (
            "kafka",
            {"bootstrap_servers": "h", "producer_config": {"acks": "1"}},
            "producer_config may not set 'acks'",
        ),
        (
            "kafka",
            {"bootstrap_servers": "h", "consumer_config": {"enable.auto.commit": True}},
            "consumer_config may not set 'enable.auto.commit'",
        ),
    ],
)
def test_bad_transport_options_are_reported(name: str, options: Any, problem: str):
    problems = transport_class(name).check_options(options)
    assert any(problem in p for p in problems), problems


def test_the_broker_transports_say_what_they_support():
    rabbitmq, kafka = transport_class("rabbitmq"), transport_class("kafka")
    assert rabbitmq.supports_consuming
    assert kafka.supports_consuming
    assert rabbitmq.supports_cross_process
    assert kafka.supports_cross_process
    assert kafka.supports_key_ordering
    assert not rabbitmq.supports_key_ordering
    assert not transport_class("in-process").supports_consuming


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "transport", "error"),
    [
        ((), "in-process", "the following arguments are required: --group"),
        (("--group", "g"), "in-process", "has no receiving side"),
        (("--group", "g", "--queue", "q"), "kafka", "--queue is for the rabbitmq transport"),
        (("--group", "g", "--topic", "t"), "rabbitmq", "--topic is for the kafka transport"),
        (("--group", "g", "--max-attempts", "0"), "rabbitmq", "--max-attempts must be at least"),
        (("--group", "", "--queue", "q"), "rabbitmq", "consumer group must not be empty"),
        (("--group", "g", "--event-type", "x.y"), "rabbitmq", "'x.y' is not registered"),
    ],
)
def test_consume_events_rejects_bad_arguments_clearly(
    settings: Any, args: tuple[str, ...], transport: str, error: str
):
    options = {"rabbitmq": {"url": "amqp://127.0.0.1:1/"}, "kafka": {"bootstrap_servers": "h"}}
    settings.OUTBOX = {
        "ENABLED": True,
        "TRANSPORT": transport,
        "TRANSPORT_OPTIONS": options.get(transport, {}),
    }
    with pytest.raises(CommandError, match=error.replace("(", r"\(")):
        call_command("consume_events", *args)


@pytest.mark.django_db(transaction=True)
def test_the_consumer_is_started_once_its_subscription_opened():
    consumer, _ = run(received(number="O-8"))
    assert consumer.started.is_set()
