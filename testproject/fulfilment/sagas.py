"""Sagas of the fulfilment demo (imported at start-up through SAGAS["AUTODISCOVER_MODULE"]).

``fulfilment.order`` is the saga of ``docs/sagas.md``: the steps below, without their
``@probed`` test hooks, are the documentation's example.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from jobs import JobSubmission, stage_job
from outbox.faults import fault_point
from sagas import SagaContext, saga

from .events import ShipmentRequested
from .models import Notice, Payment, Reservation, Shipment, StepRun


class PaymentDeclined(Exception):
    pass


# --------------------------------------------------------------------------- test hooks


def _journal(ctx: SagaContext, kind: str, event: str) -> None:
    """Append a line to ``data["journal"]`` (a file), outside any transaction: it shows
    every run that started, committed or not."""
    path = ctx.data.get("journal")
    if path:
        with open(path, "a") as journal:
            journal.write(f"{ctx.instance_id} {ctx.step} {kind} {event} {os.getpid()}\n")


def _hold(ctx: SagaContext) -> None:
    """``data["hold"] = {"step": …, "file": …, "started_file": …, "obey_cancel": …}``:
    the step waits until ``file`` exists — watching its cancellation signal, or not."""
    hold = ctx.data.get("hold") or {}
    if hold.get("step") != ctx.step or ctx.compensating:
        return
    if hold.get("started_file"):
        Path(hold["started_file"]).touch()
    release = Path(hold["file"])
    while not release.exists():
        if hold.get("obey_cancel"):
            ctx.wait_for_cancel(0.05)
            ctx.raise_if_cancelled()
        else:
            time.sleep(0.05)  # deliberately deaf to the cancellation signal


def probed(step: Callable[[SagaContext], None]) -> Callable[[SagaContext], None]:
    """Wrap a step for the tests: journal its start and end, honour ``hold``, count its
    committed runs (``StepRun``, in the step's transaction), offer a fault point
    inside its transaction, and fail it on request (``data["fail_at"]``,
    ``data["fail_compensation"] = {step: times}``)."""

    @functools.wraps(step)
    def run(ctx: SagaContext) -> None:
        kind = "compensation" if ctx.compensating else "action"
        _journal(ctx, kind, "start")
        try:
            _hold(ctx)
            step(ctx)
            StepRun.objects.create(
                instance_id=ctx.instance_id, step=ctx.step, kind=kind, pid=os.getpid()
            )
            fault_point(f"fulfilment.{ctx.step}.inside", step=ctx.step, kind=kind)
            if not ctx.compensating and ctx.data.get("fail_at") == ctx.step:
                raise PaymentDeclined(f"injected failure in {ctx.step}")
            failures = (ctx.data.get("fail_compensation") or {}).get(ctx.step, 0)
            if ctx.compensating and ctx.attempt <= failures:
                raise RuntimeError(f"injected failure compensating {ctx.step}")
        finally:
            _journal(ctx, kind, "end")

    return run


# --------------------------------------------------------------------------- the saga


@probed
def reserve(ctx: SagaContext) -> None:
    reservation = Reservation.objects.create(
        order_id=ctx.data["order_id"], sku=ctx.data["sku"], quantity=ctx.data["quantity"]
    )
    ctx.data["reservation_id"] = reservation.pk


@probed
def release(ctx: SagaContext) -> None:
    Reservation.objects.filter(pk=ctx.data["reservation_id"]).update(released=True)


@probed
def charge(ctx: SagaContext) -> None:
    # What an earlier step wrote is in ctx.data, also after a crash and recovery.
    payment = Payment.objects.create(
        order_id=ctx.data["order_id"],
        amount=Decimal(ctx.data["amount"]),
        reservation_id=ctx.data["reservation_id"],
    )
    ctx.data["payment_id"] = payment.pk


@probed
def refund(ctx: SagaContext) -> None:
    Payment.objects.filter(pk=ctx.data["payment_id"]).update(refunded=True)


@probed
def ship(ctx: SagaContext) -> None:
    order_id = ctx.data["order_id"]
    shipment = Shipment.objects.create(order_id=order_id, payment_id=ctx.data["payment_id"])
    # The job and the event commit with the shipment and the step's completion.
    stage_job(
        "fulfilment",
        f"dispatch-{ctx.instance_id}",
        JobSubmission.create("fulfilment.dispatch", {"shipment_id": shipment.pk}),
    )
    ctx.unit_of_work.add_integration_event(
        ShipmentRequested(order_id=order_id, shipment_id=shipment.pk), key=str(order_id)
    )
    ctx.data["shipment_id"] = shipment.pk


order_fulfillment = (
    saga("fulfilment.order")
    .step("reserve", reserve, compensate=release)
    .step("charge", charge, compensate=refund)
    .step("ship", ship)
)


# --------------------------------------------------------------------------- variants


@probed
def notify(ctx: SagaContext) -> None:
    Notice.objects.create(order_id=ctx.data["order_id"], text="your order is on its way")


# A step nothing can undo, between two that can.
order_with_notice = (
    saga("fulfilment.order-with-notice")
    .step("reserve", reserve, compensate=release)
    .step("notify", notify)
    .step("charge", charge, compensate=refund)
)

# The same as fulfilment.order, with a per-step timeout on charge.
timed_order = (
    saga("fulfilment.timed-order")
    .step("reserve", reserve, compensate=release)
    .step("charge", charge, compensate=refund, timeout=1.0)
    .step("ship", ship)
)
