"""The inbox — a redelivery is detected and skipped; the inbox record, business
rows, staged jobs and new outbox messages commit or roll back together."""

from __future__ import annotations

import contextlib
import threading
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction

from jobs import JobSubmission, stage_job
from jobs.exceptions import JobIdentityConflict
from jobs.models import Job
from outbox import event_bus, unit_of_work
from outbox.exceptions import InvalidInput, TransactionRequired, UnitOfWorkRolledBack
from outbox.inbox import consume
from outbox.models import InboxMessage, OutboxMessage
from outbox.testing import fault_at
from outbox.types import Envelope
from testproject.orders.events import InvoiceIssued, OrderPlaced
from testproject.orders.models import Delivery, Invoice

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}


def test_a_first_delivery_is_fresh_and_a_redelivery_is_not():
    message_id = uuid.uuid4()
    with unit_of_work(), consume("billing", message_id) as fresh:
        assert fresh
    with unit_of_work(), consume("billing", str(message_id)) as fresh:
        assert not fresh  # the same id, as a UUID or as text
    with transaction.atomic(), consume("shipping", message_id) as fresh:
        assert fresh  # each consumer has its own record
    assert sorted(InboxMessage.objects.values_list("consumer", "message_id")) == [
        ("billing", str(message_id)),
        ("shipping", str(message_id)),
    ]


class HandlerFailed(Exception):
    pass


def test_a_rolled_back_consumption_leaves_no_record_so_the_redelivery_is_fresh():
    def handle() -> None:
        with unit_of_work(), consume("billing", "m-1") as fresh:
            assert fresh
            raise HandlerFailed()

    with pytest.raises(HandlerFailed):
        handle()
    assert not InboxMessage.objects.exists()
    with unit_of_work(), consume("billing", "m-1") as fresh:
        assert fresh


def test_an_error_escaping_consume_dooms_the_transaction_even_if_caught_outside():
    def handle() -> None:
        with unit_of_work():
            Invoice.objects.create(order_number="X-1", total=1, message_id="m-1")
            with contextlib.suppress(HandlerFailed), consume("billing", "m-1"):
                raise HandlerFailed("half-done")

    with pytest.raises(UnitOfWorkRolledBack):
        handle()
    assert not Invoice.objects.exists()
    assert not InboxMessage.objects.exists()


def test_consume_needs_a_transaction_and_valid_names():
    with pytest.raises(TransactionRequired), consume("billing", "m-1"):
        pass
    with transaction.atomic():
        for consumer, message_id in [("", "m"), ("c" * 101, "m"), ("c", ""), ("c", 7)]:
            with pytest.raises(InvalidInput), consume(consumer, message_id):  # type: ignore[arg-type]
                pass
    assert not InboxMessage.objects.exists()


def test_concurrent_deliveries_of_one_message_process_it_once(concurrently):
    def deliver() -> bool:
        with unit_of_work(), consume("billing", "m-1") as fresh:
            if fresh:
                Invoice.objects.create(order_number="X-1", total=1, message_id="m-1")
            return fresh

    outcomes = concurrently(*[deliver] * 4)
    assert [o.error for o in outcomes] == [None] * 4
    assert sorted(o.value for o in outcomes) == [False, False, False, True]
    assert Invoice.objects.count() == 1


@pytest.mark.postgres_only
def test_a_waiting_redelivery_takes_over_when_the_first_rolls_back(background, blocked_on_lock):
    inserted, release = threading.Event(), threading.Event()

    def first() -> None:
        with unit_of_work(), consume("billing", "m-1") as fresh:
            assert fresh
            inserted.set()
            release.wait(30)
            raise RuntimeError("crashed before finishing")

    def second() -> bool:
        with unit_of_work(), consume("billing", "m-1") as fresh:
            return fresh

    failed = background(first)
    assert inserted.wait(30)
    taking_over = background(second)
    blocked_on_lock()  # the second waits on the first's uncommitted record
    release.set()
    with pytest.raises(RuntimeError):
        failed.result(30)
    assert taking_over.result(30) is True
    assert InboxMessage.objects.count() == 1


# --------------------------------------------------------------------------- all four or none


def order_placed_message(number: str = "O-1") -> tuple[OrderPlaced, Envelope]:
    event = OrderPlaced(number, Decimal("12.50"), datetime(2026, 11, 29, tzinfo=UTC))
    envelope = Envelope(
        message_id=uuid.uuid4(),
        event_type=event.event_name,
        payload_json=event.to_json(),
        created_at=datetime.now(UTC),
    )
    return event, envelope


def four_counts() -> tuple[int, int, int, int]:
    """Inbox records, invoices, staged jobs, new outbox messages."""
    return (
        InboxMessage.objects.filter(consumer="billing").count(),
        Invoice.objects.count(),
        Job.objects.count(),
        OutboxMessage.objects.filter(event_type=InvoiceIssued.event_name).count(),
    )


@pytest.mark.parametrize(
    "point",
    [
        "orders.billing.inbox_recorded",
        "orders.billing.invoice_created",
        "orders.billing.job_staged",
        "orders.billing.event_added",
    ],
)
def test_inbox_business_row_job_and_outbox_message_commit_all_or_none(point):
    """The billing consumer (testproject/orders/events.py) records the message in the
    inbox, creates an invoice, stages a rendering job and adds an InvoiceIssued event
    in one unit of work. A failure after any step leaves none of the four."""
    event, envelope = order_placed_message()
    with fault_at(point, RuntimeError(f"fault at {point}")) as reached:
        result = event_bus.publish(event, envelope=envelope)
    assert len(reached) == 1
    assert not result.ok
    assert f"fault at {point}" in result.describe_failures()
    assert four_counts() == (0, 0, 0, 0)
    assert not Delivery.objects.exists()

    # The redelivery succeeds: all four, once.
    assert event_bus.publish(event, envelope=envelope).ok
    assert four_counts() == (1, 1, 1, 1)
    # A further redelivery is recognised and changes nothing.
    assert event_bus.publish(event, envelope=envelope).ok
    assert four_counts() == (1, 1, 1, 1)
    assert list(Delivery.objects.values_list("fresh", flat=True)) == [True, False]


def test_a_caught_stage_job_conflict_still_rolls_back_all_four():
    stage_sub = JobSubmission.create("invoices.render", {"number": "O-1"})
    with unit_of_work():
        stage_job("billing", "invoice-O-1", stage_sub)
    before = four_counts()

    def handle() -> None:
        with unit_of_work() as uow, consume("billing", "m-2") as fresh:
            assert fresh
            Invoice.objects.create(order_number="O-2", total=1, message_id="m-2")
            uow.add_integration_event(InvoiceIssued("O-2", Decimal(1)))
            # The handler "handles" the conflict; the transaction is doomed anyway.
            with contextlib.suppress(JobIdentityConflict):
                stage_job(
                    "billing",
                    "invoice-O-1",
                    JobSubmission.create("invoices.render", {"number": "other"}),
                )

    with pytest.raises(UnitOfWorkRolledBack):
        handle()
    assert four_counts() == before == (0, 0, 1, 0)
