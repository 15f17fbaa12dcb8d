"""The demo shop: one view writes the order, stages its invoice job, records its
OrderPlaced event and starts its fulfilment saga in one transaction; the engines
then fulfil it (or compensate)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobs import JobScope, JobStatus
from jobs.handlers import autodiscover
from jobs.models import Job
from jobs.worker import Worker
from outbox.dispatcher import Dispatcher
from outbox.models import OutboxMessage
from sagas.models import SagaInstance
from sagas.runner import SagaRunner
from testproject.shop import services
from testproject.shop.models import Notification, Order, Payment, Product, Shipment

pytestmark = pytest.mark.django_db(transaction=True)

GOOD_CARD = "4242 4242 4242 4242"
DECLINED_CARD = "4000 0000 0000 0002"


@pytest.fixture
def mug() -> Product:
    return Product.objects.create(sku="MUG-1", name="Mug", price=Decimal("12.50"), stock=10)


def order_through_view(client, card: str = GOOD_CARD, quantity: int = 2) -> Order:
    response = client.post(
        "/shop/", {"email": "ada@example.com", "sku": "MUG-1", "quantity": quantity, "card": card}
    )
    assert response.status_code == 302, response.content
    return Order.objects.get()


def run_engines() -> None:
    autodiscover()  # what run_jobs does first: import each app's tasks module
    SagaRunner(burst=True).run()
    Dispatcher(burst=True, listen=False).run()
    Worker(burst=True, listen=False).run()


def test_placing_an_order_writes_order_job_event_and_saga_together(client, mug):
    order = order_through_view(client)
    invoice = JobScope(order.scope).get(order.invoice_job_id)
    assert invoice is not None
    assert invoice.status == JobStatus.QUEUED
    assert invoice.payload == {"order": order.number}
    assert OutboxMessage.objects.get().event_type == "shop.order_placed"
    saga = SagaInstance.objects.get(name="shop.fulfil")
    assert saga.idempotency_key == order.number
    assert saga.data["quantity"] == 2


@pytest.mark.parametrize("failing", ["stage_job", "start_saga"])
def test_a_failure_anywhere_in_placing_leaves_nothing(mug, monkeypatch, failing):
    def boom(*args, **kwargs):
        raise RuntimeError(f"{failing} failed")

    monkeypatch.setattr(services, failing, boom)
    with pytest.raises(RuntimeError, match=failing):
        services.place_order(email="ada@example.com", sku="MUG-1", quantity=1, card=GOOD_CARD)
    assert Order.objects.count() == 0
    assert Job.objects.count() == 0
    assert OutboxMessage.objects.count() == 0
    assert SagaInstance.objects.count() == 0


def test_an_order_is_fulfilled_invoiced_and_confirmed_once(client, mug):
    order = order_through_view(client)
    run_engines()
    order.refresh_from_db()
    assert order.status == Order.Status.FULFILLED
    assert order.invoice == f"invoices/{order.number}.pdf"
    assert Product.objects.get(sku="MUG-1").stock == 8
    assert Payment.objects.get(order=order).refunded is False
    assert Shipment.objects.get(order=order).tracking == f"TRK-{order.number}"
    assert JobScope(order.scope).get(f"label-{order.number}").status == JobStatus.SUCCEEDED
    invoice = JobScope(order.scope).get(order.invoice_job_id)
    assert invoice.status == JobStatus.SUCCEEDED
    assert invoice.progress == 100
    assert Notification.objects.filter(order_number=order.number).count() == 1


def test_a_declined_card_releases_the_stock_and_cancels_the_order(client, mug):
    order = order_through_view(client, card=DECLINED_CARD)
    run_engines()
    order.refresh_from_db()
    assert order.status == Order.Status.CANCELLED
    assert Product.objects.get(sku="MUG-1").stock == 10
    assert not Payment.objects.exists()
    saga = SagaInstance.objects.get(name="shop.fulfil")
    assert saga.status == "compensated"
    assert saga.compensated_steps == ["reserve"]


def test_out_of_stock_is_compensated_without_charging(client, mug):
    order = order_through_view(client, quantity=11)
    run_engines()
    order.refresh_from_db()
    assert order.status == Order.Status.PLACED  # nothing reserved, nothing to release
    assert SagaInstance.objects.get().failed_step == "reserve"
    assert not Payment.objects.exists()


def test_order_page_and_live_invoice_progress(client, mug):
    order = order_through_view(client)
    page = client.get(f"/shop/orders/{order.number}/")
    assert page.status_code == 200
    assert b'id="invoice-bar"' in page.content
    progress = client.get(f"/shop/orders/{order.number}/invoice.json").json()
    assert progress == {
        "status": "queued",
        "progress": 0,
        "message": "",
        "attempt": 0,
        "result": None,
    }
    autodiscover()
    Worker(burst=True, listen=False).run()
    progress = client.get(f"/shop/orders/{order.number}/invoice.json").json()
    assert progress["status"] == "succeeded"
    assert progress["progress"] == 100
    assert progress["message"] == "page 4 of 4"
    assert client.get("/shop/orders/NOPE/invoice.json").status_code == 404


def test_bad_order_input_is_rejected_and_writes_nothing(client, mug):
    response = client.post(
        "/shop/", {"email": "ada@example.com", "sku": "NOPE", "quantity": 1, "card": GOOD_CARD}
    )
    assert response.status_code == 200
    assert b"unknown product" in response.content
    assert Order.objects.count() == 0
    assert Job.objects.count() == 0
