"""The unit of work — commit, rollback, nesting, domain events after commit,
integration events through the outbox or in process — on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import threading
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, connections, transaction

import outbox.uow
from outbox import (
    DomainEvent,
    IntegrationEvent,
    UnitOfWork,
    current_envelope,
    current_unit_of_work,
    event_bus,
    unit_of_work,
)
from outbox.exceptions import InvalidEvent, InvalidInput, NoActiveUnitOfWork, UnitOfWorkRolledBack
from outbox.models import OutboxMessage
from outbox.testing import capture_events, deliver_outbox
from outbox.types import MessageStatus
from testproject.orders.events import OrderCreated, OrderPlaced
from testproject.orders.models import Invoice, Order
from testproject.orders.services import place_order

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass(frozen=True)
class Noted(DomainEvent, name="test.uow.noted"):
    text: str


@dataclass(frozen=True)
class Shipped(IntegrationEvent, name="test.uow.shipped"):
    number: str
    weight: Decimal


@pytest.fixture
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}


@pytest.fixture
def outbox_off(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": False}


def make_order(number: str) -> Order:
    return Order.objects.create(number=number, total=Decimal("10.00"))


def visible_elsewhere(number: str) -> bool:
    """Whether another connection (another thread) sees the order: committed data."""
    seen: list[bool] = []

    def read() -> None:
        try:
            seen.append(Order.objects.filter(number=number).exists())
        finally:
            connections.close_all()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(30)
    return seen == [True]


# --------------------------------------------------------------------------- domain events


def test_domain_events_are_published_after_commit_in_order():
    observed: list[tuple[str, bool, bool]] = []

    def subscriber(event: Noted) -> None:
        in_transaction = transaction.get_connection().in_atomic_block
        observed.append((event.text, in_transaction, visible_elsewhere("A-1")))

    event_bus.subscribe(Noted, subscriber)
    try:
        with unit_of_work() as uow:
            make_order("A-1")
            uow.add_domain_event(Noted("first"))
            uow.add_domain_event(Noted("second"))
            assert observed == []  # nothing before the commit
        assert observed == [("first", False, True), ("second", False, True)]
    finally:
        event_bus.unsubscribe(Noted, subscriber)


class OutOfStock(Exception):
    pass


def test_an_exception_rolls_back_propagates_unchanged_and_publishes_nothing():
    error = OutOfStock("out of stock")

    def place() -> None:
        with unit_of_work() as uow:
            make_order("A-1")
            uow.add_domain_event(Noted("never"))
            raise error

    with capture_events(Noted) as published, pytest.raises(OutOfStock) as raised:
        place()
    assert raised.value is error
    assert published == []
    assert not Order.objects.exists()


def test_nested_unit_joins_the_outer_transaction_and_commits_with_it():
    with capture_events(Noted) as published:
        with unit_of_work() as outer:
            make_order("A-1")
            with unit_of_work() as inner:
                make_order("A-2")
                inner.add_domain_event(Noted("inner"))
            # The inner unit did not commit: no other connection sees its row yet.
            assert not visible_elsewhere("A-2")
            assert published == []
            outer.add_domain_event(Noted("outer"))
        assert [e.text for e in published] == ["inner", "outer"]
    assert visible_elsewhere("A-1")
    assert visible_elsewhere("A-2")


def test_inner_failure_caught_by_the_outer_code_still_rolls_back_everything():
    inner_error = RuntimeError("card declined")

    def place() -> None:
        with unit_of_work() as outer:
            make_order("A-1")
            outer.add_domain_event(Noted("outer"))
            try:
                with unit_of_work() as inner:
                    make_order("A-2")
                    inner.add_domain_event(Noted("inner"))
                    raise inner_error
            except RuntimeError:
                pass  # the outer code "handles" it and carries on

    with capture_events(Noted) as published, pytest.raises(UnitOfWorkRolledBack) as raised:
        place()
    assert raised.value.__cause__ is inner_error
    assert published == []
    assert not Order.objects.exists()


def test_after_an_inner_failure_further_queries_fail_and_nothing_commits():
    def place() -> None:
        with unit_of_work() as outer:
            make_order("A-1")
            outer.add_domain_event(Noted("outer"))
            with contextlib.suppress(IntegrityError), unit_of_work():
                make_order("A-1")  # duplicate number: IntegrityError inside
            make_order("A-3")

    with capture_events(Noted) as published, pytest.raises(transaction.TransactionManagementError):
        place()
    assert published == []
    assert not Order.objects.exists()


def test_a_savepoint_rolled_back_inside_a_unit_discards_its_own_events_only():
    with capture_events(Noted) as published, unit_of_work() as uow:
        make_order("A-1")
        uow.add_domain_event(Noted("kept"))
        try:
            with transaction.atomic():
                make_order("A-2")
                uow.add_domain_event(Noted("discarded"))
                raise ValueError("undo this part")
        except ValueError:
            pass
    assert [e.text for e in published] == ["kept"]
    assert list(Order.objects.values_list("number", flat=True)) == ["A-1"]


def test_inside_a_callers_atomic_block_events_wait_for_the_outer_commit():
    with capture_events(Noted) as published:
        with transaction.atomic():
            with unit_of_work() as uow:
                make_order("A-1")
                uow.add_domain_event(Noted("later"))
            assert published == []
        assert [e.text for e in published] == ["later"]

        def caller_rolls_back() -> None:
            with transaction.atomic():
                with unit_of_work() as uow:
                    make_order("A-2")
                    uow.add_domain_event(Noted("never"))
                raise OutOfStock("the caller rolls back")

        with pytest.raises(OutOfStock):
            caller_rolls_back()
    assert [e.text for e in published] == ["later"]
    assert list(Order.objects.values_list("number", flat=True)) == ["A-1"]


def test_decorator_block_and_current_unit_forms():
    @unit_of_work
    def create(number: str, depth: int = 0) -> Order:
        order = make_order(number)
        current_unit_of_work().add_domain_event(Noted(number))
        if depth:
            create(f"{number}-nested", depth - 1)  # re-entrant: joins this unit
        return order

    with capture_events(Noted) as published:
        assert create("D-1", depth=1).number == "D-1"
        with unit_of_work() as uow:
            make_order("E-1")
            uow.add_domain_event(Noted("E-1"))
        with pytest.raises(ValueError, match="rolled back"):
            create_failing()
    assert [e.text for e in published] == ["D-1", "D-1-nested", "E-1"]
    assert sorted(Order.objects.values_list("number", flat=True)) == ["D-1", "D-1-nested", "E-1"]


@unit_of_work()
def create_failing() -> None:
    make_order("F-1")
    current_unit_of_work().add_domain_event(Noted("F-1"))
    raise ValueError("rolled back")


def test_events_cannot_be_added_without_an_open_unit():
    with unit_of_work() as uow:
        pass
    with pytest.raises(NoActiveUnitOfWork):
        uow.add_domain_event(Noted("late"))
    with pytest.raises(NoActiveUnitOfWork):
        current_unit_of_work()
    with pytest.raises(NoActiveUnitOfWork), transaction.atomic():
        # An atomic block alone is not a unit of work.
        UnitOfWork().add_integration_event(Shipped("S-1", Decimal(1)))


def test_events_of_the_wrong_kind_are_refused():
    with unit_of_work() as uow:
        with pytest.raises(InvalidEvent):
            uow.add_domain_event(Shipped("S-1", Decimal(1)))  # type: ignore[arg-type]
        with pytest.raises(InvalidEvent):
            uow.add_integration_event(Noted("x"))  # type: ignore[arg-type]
        with pytest.raises(InvalidEvent):
            uow.add_domain_event({"not": "an event"})  # type: ignore[arg-type]


def test_a_model_collecting_events_hands_them_over_when_saved_through_the_unit(outbox_on):
    with capture_events(OrderCreated) as created, unit_of_work() as uow:
        order = Order(number="C-1", total=Decimal("5.00"))
        order.record_event(OrderCreated("C-1"))
        order.record_event(Shipped("C-1", Decimal("2.5")))
        uow.save(order)
        assert order.take_events() == []
    assert created == [OrderCreated("C-1")]
    assert list(OutboxMessage.objects.values_list("event_type", flat=True)) == ["test.uow.shipped"]


# --------------------------------------------------------------------------- integration events


def test_outbox_on_business_row_and_message_commit_together(outbox_on):
    with capture_events(Shipped) as published, unit_of_work() as uow:
        make_order("S-1")
        envelope = uow.add_integration_event(
            Shipped("S-1", Decimal("1.25")), key="S-1", headers={"tenant": "acme"}
        )
    assert published == []  # delivered by the dispatcher, not at commit
    message = OutboxMessage.objects.get()
    assert message.message_id == envelope.message_id
    assert message.event_type == "test.uow.shipped"
    assert message.key == "S-1"
    assert message.headers == {"tenant": "acme"}
    assert message.payload_json == '{"number":"S-1","weight":"1.25"}'
    assert message.status == MessageStatus.PENDING
    assert message.attempts == 0
    assert message.sent_at is None
    assert Order.objects.filter(number="S-1").exists()


def test_outbox_on_rollback_leaves_neither_row(outbox_on):
    def place() -> None:
        with unit_of_work() as uow:
            make_order("S-1")
            uow.add_integration_event(Shipped("S-1", Decimal(1)))
            raise OutOfStock("payment failed")

    with pytest.raises(OutOfStock):
        place()
    assert not Order.objects.exists()
    assert not OutboxMessage.objects.exists()


@pytest.mark.parametrize("query_after", [False, True], ids=["then-return", "then-query"])
def test_outbox_on_a_failed_message_write_dooms_the_transaction_even_if_caught(
    outbox_on, monkeypatch, query_after
):
    # Every event gets the same message id, so the second insert fails.
    fixed = outbox.uow.make_envelope(Shipped("S-1", Decimal(1)))
    monkeypatch.setattr(outbox.uow, "make_envelope", lambda event, **kwargs: fixed)

    def place() -> None:
        with unit_of_work() as uow:
            make_order("S-1")
            uow.add_integration_event(Shipped("S-1", Decimal(1)))
            with pytest.raises(DatabaseError):
                uow.add_integration_event(Shipped("S-1", Decimal(1)))
            if query_after:
                make_order("S-2")

    # The unit never ends as if it had committed. After the failed insert PostgreSQL
    # refuses further queries; SQLite would go on, but the unit still rolls back.
    expected = (UnitOfWorkRolledBack, transaction.TransactionManagementError)
    with pytest.raises(expected if query_after else UnitOfWorkRolledBack) as raised:
        place()
    if isinstance(raised.value, UnitOfWorkRolledBack):
        assert isinstance(raised.value.__cause__, IntegrityError)
    assert not Order.objects.exists()
    assert not OutboxMessage.objects.exists()


def test_outbox_off_publishes_in_process_after_commit_with_a_message_id(outbox_off):
    seen: list[tuple[Shipped, uuid.UUID | None, bool]] = []

    def subscriber(event: Shipped) -> None:
        envelope = current_envelope()
        seen.append((event, envelope.message_id if envelope else None, visible_elsewhere("S-1")))

    event_bus.subscribe(Shipped, subscriber)
    try:
        with unit_of_work() as uow:
            make_order("S-1")
            envelope = uow.add_integration_event(Shipped("S-1", Decimal("1.25")))
            assert seen == []
        with pytest.raises(OutOfStock):
            rolled_back_shipment()
    finally:
        event_bus.unsubscribe(Shipped, subscriber)
    assert seen == [(Shipped("S-1", Decimal("1.25")), envelope.message_id, True)]
    assert not OutboxMessage.objects.exists()


def rolled_back_shipment() -> None:
    with unit_of_work() as uow:
        uow.add_integration_event(Shipped("S-2", Decimal(2)))
        raise OutOfStock("rolled back")


@pytest.mark.parametrize("enabled", [True, False], ids=["outbox-on", "outbox-off"])
def test_the_same_calling_code_works_in_both_set_ups(settings, enabled):
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": enabled}
    with capture_events(OrderCreated, OrderPlaced) as published:
        place_order("P-1", Decimal("99.90"))
        if enabled:
            assert [type(e) for e in published] == [OrderCreated]
            assert not Invoice.objects.exists()
            stats = deliver_outbox()
            assert stats.sent >= 1
    assert [type(e) for e in published] == [OrderCreated, OrderPlaced]
    placed = published[1]
    assert isinstance(placed, OrderPlaced)
    assert placed.total == Decimal("99.90")
    invoice = Invoice.objects.get()
    assert (invoice.order_number, invoice.total) == ("P-1", Decimal("99.90"))
    assert OutboxMessage.objects.filter(event_type="orders.placed").count() == int(enabled)


def test_bad_events_and_message_fields_are_refused_before_anything_is_written(outbox_on):
    @dataclass(frozen=True)
    class Tagged(IntegrationEvent, name="test.uow.tagged"):
        tags: set[str]

    class NotADataclass(IntegrationEvent, name="test.uow.plain"):
        pass

    with unit_of_work() as uow:
        make_order("B-1")
        with pytest.raises(InvalidEvent, match="not JSON"):
            uow.add_integration_event(Tagged({"a"}))
        with pytest.raises(InvalidEvent, match="dataclass"):
            uow.add_integration_event(NotADataclass())
        with pytest.raises(InvalidInput, match="key"):
            uow.add_integration_event(Shipped("B-1", Decimal(1)), key="k" * 201)
        with pytest.raises(InvalidInput, match="header"):
            uow.add_integration_event(Shipped("B-1", Decimal(1)), headers={"h": 1})  # type: ignore[dict-item]
    assert not OutboxMessage.objects.exists()
    assert Order.objects.count() == 1


def test_a_payload_over_the_limit_is_refused(settings, outbox_on):
    settings.OUTBOX = {**settings.OUTBOX, "MAX_PAYLOAD_BYTES": 50}
    with unit_of_work() as uow, pytest.raises(InvalidEvent, match="larger than 50 bytes"):
        uow.add_integration_event(Shipped("x" * 60, Decimal(1)))
    assert not OutboxMessage.objects.exists()


def test_a_unit_marked_for_rollback_rolls_back_and_says_so():
    def place() -> None:
        with unit_of_work() as uow:
            make_order("R-1")
            uow.add_domain_event(Noted("never"))
            transaction.set_rollback(True)

    with capture_events(Noted) as published, pytest.raises(UnitOfWorkRolledBack) as raised:
        place()
    assert raised.value.__cause__ is None
    assert published == []
    assert not Order.objects.exists()
