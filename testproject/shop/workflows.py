"""The shop's order workflow: a basket's stock reserved (an inline step whose writes
commit with its checkpoint), its lines priced in parallel (a ``map`` of activity
jobs), the payment awaited as a signal (sent by the pay view in the transaction
that records the payment), and the parcel shipped by a child workflow."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import F

from workflows import WorkflowContext, activity, workflow

from .models import Basket, Product


class OutOfStock(Exception):
    pass


def reserve_stock(lines: list[dict[str, Any]]) -> list[str]:
    """Take each line's quantity from stock; runs in the checkpoint's transaction, so
    the stock moves exactly once whatever is killed when."""
    for line in lines:
        taken = Product.objects.filter(sku=line["sku"], stock__gte=line["quantity"]).update(
            stock=F("stock") - line["quantity"]
        )
        if not taken:
            raise OutOfStock(f"not enough {line['sku']}")
    return [line["sku"] for line in lines]


@activity("shop.price_line", retries=2)
def price_line(line: dict[str, Any]) -> str:
    """One line's price, as a decimal string (JSON has no decimals)."""
    product = Product.objects.get(sku=line["sku"])
    return str(product.price * line["quantity"])


def record_total(number: str, prices: list[str]) -> str:
    total = sum((Decimal(price) for price in prices), Decimal(0))
    Basket.objects.filter(number=number).update(total=total)
    return str(total)


def print_label(number: str, idempotency_key: str) -> str:
    tracking = f"TRK-{number}"
    Basket.objects.filter(number=number).update(status=Basket.Status.SHIPPED, tracking=tracking)
    return tracking


@workflow("shop.ship", version=1)
def ship(wf: WorkflowContext) -> dict[str, str]:
    number = wf.input["number"]
    tracking = wf.step("label", print_label, number, wf.idempotency_key("label"))
    return {"tracking": tracking}


@workflow("shop.basket", version=1)
def fulfil_basket(wf: WorkflowContext) -> dict[str, Any]:
    number, lines = wf.input["number"], wf.input["lines"]
    reserved = wf.step("reserve", reserve_stock, lines, retries=2)
    prices = wf.map("price", price_line, lines)
    total = wf.step("total", record_total, number, prices)
    payment = wf.wait_for_signal("paid", timeout=7 * 86_400)
    shipped = wf.child("ship", "shop.ship", {"number": number})
    return {
        "reserved": reserved,
        "total": total,
        "paid_by": payment["by"],
        "tracking": shipped["tracking"],
    }
