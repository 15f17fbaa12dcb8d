"""The shop's fulfilment saga: reserve stock, charge the card, ship — with
compensations that release the stock and refund the payment."""

from __future__ import annotations

from decimal import Decimal

from django.db.models import F

from jobs import JobSubmission, stage_job
from sagas import SagaContext, saga

from .models import Order, Payment, Product, Shipment


class OutOfStock(Exception):
    pass


class PaymentDeclined(Exception):
    pass


def reserve_stock(ctx: SagaContext) -> None:
    taken = Product.objects.filter(sku=ctx.data["sku"], stock__gte=ctx.data["quantity"]).update(
        stock=F("stock") - ctx.data["quantity"]
    )
    if not taken:
        raise OutOfStock(f"not enough {ctx.data['sku']} in stock")


def release_stock(ctx: SagaContext) -> None:
    Product.objects.filter(sku=ctx.data["sku"]).update(stock=F("stock") + ctx.data["quantity"])
    Order.objects.filter(number=ctx.data["order"]).update(status=Order.Status.CANCELLED)


def charge_card(ctx: SagaContext) -> None:
    if ctx.data["card"].endswith("0002"):
        raise PaymentDeclined("card declined by the issuer")
    order = Order.objects.get(number=ctx.data["order"])
    payment = Payment.objects.create(order=order, amount=Decimal(ctx.data["total"]))
    ctx.data["payment_id"] = payment.pk


def refund_card(ctx: SagaContext) -> None:
    Payment.objects.filter(pk=ctx.data["payment_id"]).update(refunded=True)


def ship(ctx: SagaContext) -> None:
    order = Order.objects.get(number=ctx.data["order"])
    Shipment.objects.create(order=order, tracking=f"TRK-{order.number}")
    order.status = Order.Status.FULFILLED
    order.save(update_fields=["status"])
    # The label job commits with the shipment and the step's completion mark.
    stage_job(
        order.scope,
        f"label-{order.number}",
        JobSubmission.create("shop.label", {"order": order.number}),
    )


fulfil_order = (
    saga("shop.fulfil")
    .step("reserve", reserve_stock, compensate=release_stock)
    .step("charge", charge_card, compensate=refund_card)
    .step("ship", ship)
)
