"""The demo shop's order workflow, through its views: the basket and its run commit
together, the stock moves once, the lines are priced by a map, the payment view's
signal wakes the run, and a child workflow ships the parcel."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from testproject.shop.models import Basket, Product
from testproject.shop.services import OrderRejected, place_basket
from workflows import RunStatus, StepKind, WorkflowScope
from workflows.models import WorkflowRun
from workflows.testing import run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def products() -> None:
    Product.objects.create(sku="MUG-1", name="Mug", price=Decimal("12.50"), stock=10)
    Product.objects.create(sku="TEE-1", name="Tee", price=Decimal("25.00"), stock=5)


def test_a_basket_is_reserved_priced_paid_and_shipped(products):
    client = Client()
    response = client.post(
        "/shop/baskets/", {"email": "cy@example.com", "lines": "MUG-1:2,TEE-1:1"}
    )
    assert response.status_code == 302
    basket = Basket.objects.get()
    runs = WorkflowScope(basket.scope)

    run_workflows_inline()
    waiting = runs.get(basket.number)
    assert waiting.status == RunStatus.WAITING
    assert waiting.waiting_for == "signal paid"
    assert [step.key for step in waiting.steps] == ["reserve", "price", "total", "paid"]
    assert waiting.step("price").kind == StepKind.MAP
    assert waiting.step("price").items.succeeded == 2
    assert dict(Product.objects.values_list("sku", "stock")) == {"MUG-1": 8, "TEE-1": 4}
    basket.refresh_from_db()
    assert basket.total == Decimal("50.00")
    page = client.get(f"/shop/baskets/{basket.number}/").content.decode()
    assert "waiting for signal paid" in page

    assert client.post(f"/shop/baskets/{basket.number}/pay/", {"card": "4242"}).status_code == 302
    run_workflows_inline()
    done = runs.get(basket.number)
    assert done.status == RunStatus.SUCCEEDED
    assert done.output == {
        "reserved": ["MUG-1", "TEE-1"],
        "total": "50.00",
        "paid_by": "card …4242",
        "tracking": f"TRK-{basket.number}",
    }
    assert runs.get(f"{basket.number}/ship").status == RunStatus.SUCCEEDED
    basket.refresh_from_db()
    assert basket.status == Basket.Status.SHIPPED
    # Replays after the payment did not take the stock again.
    assert dict(Product.objects.values_list("sku", "stock")) == {"MUG-1": 8, "TEE-1": 4}


def test_a_rejected_basket_leaves_no_run(products):
    with pytest.raises(OrderRejected):
        place_basket(email="cy@example.com", lines=[{"sku": "NOPE", "quantity": 1}])
    assert not Basket.objects.exists()
    assert not WorkflowRun.objects.exists()


def test_out_of_stock_fails_the_reserve_step_without_moving_stock(products):
    basket = place_basket(
        email="cy@example.com",
        lines=[{"sku": "MUG-1", "quantity": 2}, {"sku": "TEE-1", "quantity": 9}],
    )

    failed = run_workflow(basket.scope, basket.number)
    assert failed.status == RunStatus.FAILED
    assert failed.failed_step == "reserve"
    assert failed.step("reserve").attempts == 3
    # Each try's partial reservation (the mugs) rolled back with it.
    assert dict(Product.objects.values_list("sku", "stock")) == {"MUG-1": 10, "TEE-1": 5}
