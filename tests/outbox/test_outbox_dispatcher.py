"""In process: the Dispatcher engine — delivery, retries with backoff, parking,
lease recovery, retention, wake-ups — on SQLite and PostgreSQL."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from jobs.models import Job
from outbox import IntegrationEvent, event_bus, unit_of_work
from outbox.dispatcher import Dispatcher
from outbox.inbox import consume
from outbox.models import InboxMessage, OutboxMessage
from outbox.testing import RecordingTransport, capture_events, deliver_outbox, fault_at
from outbox.types import DeliveryReport, Envelope, MessageStatus
from testproject.orders.events import InvoiceIssued, OrderPlaced
from testproject.orders.models import Delivery, Invoice
from testproject.orders.services import place_order
from tests.support.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass(frozen=True)
class Pinged(IntegrationEvent, name="test.dispatcher.pinged"):
    n: int


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENABLED": True,
        "MAX_ATTEMPTS": 3,
        "RETRY_BASE_DELAY": 0,
        "RETRY_JITTER": 0,
    }


def stage(count: int) -> list[Envelope]:
    with unit_of_work() as uow:
        return [uow.add_integration_event(Pinged(n), key=f"k{n}") for n in range(count)]


def statuses() -> list[str]:
    return list(OutboxMessage.objects.order_by("id").values_list("status", flat=True))


class CrashedDispatcher(Exception):
    """Stands for the process dying at a fault point (real processes: see
    test_outbox_processes.py)."""


@pytest.fixture
def in_thread() -> Iterator[Any]:
    """Run a dispatcher in a thread (its own connection); stopped at the end."""
    started: list[tuple[Dispatcher, threading.Thread]] = []

    def start(dispatcher: Dispatcher) -> Dispatcher:
        def run() -> None:
            try:
                dispatcher.run()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        started.append((dispatcher, thread))
        wait_until(dispatcher.started.is_set, 30, "the dispatcher to start")
        return dispatcher

    yield start
    for dispatcher, thread in started:
        dispatcher.stop()
        thread.join(30)
        assert not thread.is_alive(), "the dispatcher did not stop"


def test_delivers_every_message_once_in_order_and_marks_it_sent():
    staged = stage(25)
    transport = RecordingTransport()
    stats = deliver_outbox(transport=transport, batch_size=10)
    assert [e.message_id for e in transport.published] == [e.message_id for e in staged]
    assert [len(b) for b in transport.batches] == [10, 10, 5]
    assert transport.published[3].key == "k3"
    assert transport.published[3].payload == {"n": 3}
    assert (stats.claimed, stats.sent, stats.batches) == (25, 25, 3)
    assert set(statuses()) == {MessageStatus.SENT}
    assert not OutboxMessage.objects.filter(sent_at__isnull=True).exists()


def test_the_in_process_transport_delivers_to_subscribers_in_the_dispatchers_process():
    for n in range(3):
        place_order(f"O-{n}", Decimal("10.00") + n)
    with capture_events(OrderPlaced) as placed:
        stats = deliver_outbox()
    assert [e.number for e in placed] == ["O-0", "O-1", "O-2"]  # type: ignore[attr-defined]
    # Billing ran for each order and, in the same transactions, staged a job and added
    # an InvoiceIssued message, which the same run delivered as well.
    assert sorted(Invoice.objects.values_list("order_number", flat=True)) == ["O-0", "O-1", "O-2"]
    assert Job.objects.count() == 3
    assert OutboxMessage.objects.filter(event_type=InvoiceIssued.event_name).count() == 3
    assert set(statuses()) == {MessageStatus.SENT}
    assert stats.sent == 6


def test_a_transport_that_keeps_failing_parks_the_message_with_its_error():
    (envelope,) = stage(1)
    transport = RecordingTransport(fail_with="broker said no")
    stats = deliver_outbox(transport=transport)
    message = OutboxMessage.objects.get()
    assert message.status == MessageStatus.PARKED
    assert message.attempts == 3
    assert message.last_error == "broker said no"
    assert len(transport.batches) == 3
    assert (stats.retried, stats.parked, stats.sent) == (2, 1, 0)
    assert envelope.message_id == message.message_id


def test_a_transport_that_raises_fails_the_batch_with_the_traceback_and_retries_later(settings):
    settings.OUTBOX = {**settings.OUTBOX, "RETRY_BASE_DELAY": 30}
    stage(2)
    before = timezone.now()
    stats = deliver_outbox(transport=RecordingTransport(raise_with=ConnectionError("refused")))
    assert (stats.claimed, stats.retried) == (2, 2)  # burst stops: the retry is not due yet
    for message in OutboxMessage.objects.all():
        assert message.status == MessageStatus.PENDING
        assert message.lease_token is None
        assert message.attempts == 1
        assert "ConnectionError: refused" in message.last_error
        assert "Traceback" in message.last_error
        assert message.available_at >= before + timedelta(seconds=30)


def test_unconfirmed_messages_of_a_batch_count_as_failed():
    staged = stage(3)

    class ForgetfulTransport(RecordingTransport):
        def publish(self, messages: Any) -> list[DeliveryReport]:
            return [DeliveryReport.delivered(m.message_id) for m in messages if m.payload["n"] == 0]

    deliver_outbox(transport=ForgetfulTransport())
    rows = {m.message_id: m for m in OutboxMessage.objects.all()}
    assert rows[staged[0].message_id].status == MessageStatus.SENT
    for envelope in staged[1:]:
        assert rows[envelope.message_id].status == MessageStatus.PARKED
        assert "did not confirm" in rows[envelope.message_id].last_error


def test_backoff_grows_exponentially_with_jitter_and_a_cap(settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "RETRY_BASE_DELAY": 2,
        "RETRY_BACKOFF_FACTOR": 3,
        "RETRY_MAX_DELAY": 100,
        "RETRY_JITTER": 0,
    }
    dispatcher = Dispatcher(transport=RecordingTransport(), listen=False)
    assert [dispatcher.retry_delay(n) for n in (1, 2, 3, 4, 5)] == [2, 6, 18, 54, 100]
    settings.OUTBOX = {**settings.OUTBOX, "RETRY_JITTER": 0.25}
    dispatcher = Dispatcher(transport=RecordingTransport(), listen=False, rng=random.Random(3))
    delays = [dispatcher.retry_delay(1) for _ in range(200)]
    assert min(delays) >= 1.5
    assert max(delays) <= 2.5
    assert len(set(delays)) > 100


def test_a_failing_subscriber_gets_the_message_again_and_the_inbox_skips_the_rest():
    """At least once: the first delivery fails in one subscriber after another one
    already did its work; the redelivery runs both again, and the inbox tells the
    one that already committed to skip."""
    calls: list[tuple[str, bool]] = []
    failures = iter([RuntimeError("flaky downstream")])

    def bookkeeping(event: Pinged) -> None:
        from outbox import current_envelope

        envelope = current_envelope()
        assert envelope is not None
        with unit_of_work(), consume("bookkeeping", envelope.message_id) as fresh:
            calls.append(("bookkeeping", fresh))

    def flaky(event: Pinged) -> None:
        calls.append(("flaky", True))
        error = next(failures, None)
        if error is not None:
            raise error

    event_bus.subscribe(Pinged, bookkeeping)
    event_bus.subscribe(Pinged, flaky)
    try:
        stage(1)
        stats = deliver_outbox()
    finally:
        event_bus.unsubscribe(Pinged, bookkeeping)
        event_bus.unsubscribe(Pinged, flaky)
    assert calls == [
        ("bookkeeping", True),
        ("flaky", True),
        ("bookkeeping", False),
        ("flaky", True),
    ]
    assert (stats.retried, stats.sent) == (1, 1)
    assert InboxMessage.objects.filter(consumer="bookkeeping").count() == 1


@pytest.mark.parametrize("point", ["outbox.dispatcher.claimed", "outbox.dispatcher.published"])
def test_a_dispatcher_dying_mid_batch_loses_nothing_and_a_restart_delivers(point):
    for n in range(4):
        place_order(f"O-{n}", Decimal("5.00"))
    with fault_at(point, CrashedDispatcher()), pytest.raises(CrashedDispatcher):
        deliver_outbox(dispatcher_id="d1", batch_size=10)
    leased = OutboxMessage.objects.leased()
    assert leased.count() == 4
    assert set(leased.values_list("leased_by", flat=True)) == {"d1"}
    delivered_before = Delivery.objects.count()
    assert delivered_before == (4 if point.endswith("published") else 0)

    stats = deliver_outbox(dispatcher_id="d1", batch_size=10)  # restarted: same id
    assert stats.recovered == 4
    placed = OutboxMessage.objects.filter(event_type=OrderPlaced.event_name)
    assert set(placed.values_list("status", flat=True)) == {MessageStatus.SENT}
    assert set(placed.values_list("attempts", flat=True)) == {2}
    # Redeliveries reached billing again and were recognised by the inbox.
    assert Invoice.objects.count() == 4
    assert Delivery.objects.filter(fresh=True).count() == 4
    assert Delivery.objects.filter(fresh=False).count() == delivered_before


def test_another_dispatcher_recovers_a_batch_once_its_lease_expired():
    stage(2)
    with (
        fault_at("outbox.dispatcher.claimed", CrashedDispatcher()),
        pytest.raises(CrashedDispatcher),
    ):
        deliver_outbox(dispatcher_id="gone")
    transport = RecordingTransport()
    deliver_outbox(dispatcher_id="other", transport=transport)
    assert transport.published == []  # the lease still holds
    later = timezone.now() + timedelta(minutes=5)
    stats = deliver_outbox(dispatcher_id="other", transport=transport, clock=lambda: later)
    assert stats.recovered == 2
    assert len(transport.published) == 2
    assert set(statuses()) == {MessageStatus.SENT}


def test_retention_deletes_old_sent_messages_only(settings):
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION_SECONDS": 3600}
    stage(3)
    deliver_outbox(transport=RecordingTransport())
    stage(1)  # not delivered: kept whatever its age
    later = timezone.now() + timedelta(hours=2)
    stats = deliver_outbox(transport=RecordingTransport(fail_with="down"), clock=lambda: later)
    assert stats.purged == 3
    assert statuses() == [MessageStatus.PARKED]


def test_a_running_dispatcher_polls_for_new_messages_and_stops_on_request(settings, in_thread):
    settings.OUTBOX = {**settings.OUTBOX, "POLL_INTERVAL": 0.05}
    transport = RecordingTransport()
    dispatcher = in_thread(Dispatcher(transport=transport, listen=False))
    wait_until(dispatcher.idle.is_set, 30, "the dispatcher to wait for work")
    stage(2)
    wait_until(lambda: len(transport.published) == 2, 30, "both messages delivered")
    # The fixture stops it and fails if run() does not return.


@pytest.mark.postgres_only
def test_postgres_notify_wakes_a_dispatcher_on_commit(settings, in_thread):
    """The poll interval is an hour: only the NOTIFY sent in the committing
    transaction can make the dispatcher deliver within the wait."""
    settings.OUTBOX = {
        **settings.OUTBOX,
        "POLL_INTERVAL": 3600,
        "RECOVERY_INTERVAL": 3600,
        "CLEANUP_INTERVAL": 3600,
    }
    transport = RecordingTransport()
    dispatcher = in_thread(Dispatcher(transport=transport, listen=True))
    assert dispatcher._listener is not None
    wait_until(dispatcher._listener.ready.is_set, 30, "the listener to LISTEN")
    wait_until(dispatcher.idle.is_set, 30, "the dispatcher to wait for work")

    def rolled_back() -> None:
        with unit_of_work() as uow:
            uow.add_integration_event(Pinged(0))
            raise CrashedDispatcher("rolled back: no notification, no message")

    with pytest.raises(CrashedDispatcher):
        rolled_back()
    staged = stage(1)
    wait_until(lambda: len(transport.published) == 1, 20, "the woken dispatcher to deliver")
    assert transport.published[0].message_id == staged[0].message_id


class SlowTransport(RecordingTransport):
    """Publishes only when the test lets it (a broker that takes its time)."""

    def __init__(self) -> None:
        super().__init__()
        self.publishing = threading.Event()
        self.go = threading.Event()

    def publish(self, messages):  # type: ignore[no-untyped-def]
        self.publishing.set()
        assert self.go.wait(30), "the test never let the publish finish"
        return super().publish(messages)


def test_a_batch_that_publishes_longer_than_its_lease_keeps_it(settings):
    """The lease of a batch is renewed while it publishes: another dispatcher's
    recovery, after the first lease would have expired, finds nothing to take, and
    every message is sent once."""
    settings.OUTBOX = {**settings.OUTBOX, "LEASE_SECONDS": 0.6}
    stage(3)
    transport = SlowTransport()
    slow = Dispatcher(transport=transport, listen=False)
    outcome: list[int] = []

    def publish_slowly() -> None:
        try:
            outcome.append(slow.dispatch_batch())
        finally:
            connections.close_all()

    thread = threading.Thread(target=publish_slowly)
    thread.start()
    try:
        assert transport.publishing.wait(30)
        first_expiry = OutboxMessage.objects.values_list("lease_expires_at", flat=True)[0]
        wait_until(
            lambda: (
                timezone.now() > first_expiry
                and OutboxMessage.objects.filter(lease_expires_at__gt=timezone.now()).count() == 3
            ),
            30,
            "the first lease to pass and a renewed one to hold",
        )
        other = Dispatcher(transport=RecordingTransport(), listen=False)
        assert other.recover().total == 0
        assert other.dispatch_batch() == 0
    finally:
        transport.go.set()
        thread.join(30)
    assert outcome == [3]
    assert statuses() == ["sent"] * 3
    assert len(transport.published) == 3
