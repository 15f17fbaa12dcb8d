"""Job handlers of the demo shop (imported by the worker's autodiscovery)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from django.db import transaction

from jobs import JobContext, job_handler
from jobs.handlers import RetryPolicy

from . import workflows  # noqa: F401  (registers the order workflow and its activity)
from .models import Order, WorkLog

#: Retry at once: the demo and the tests should not wait for a backoff.
NO_DELAY = RetryPolicy(base_delay=0, jitter=0)


def _log(ctx: JobContext, note: str = "") -> None:
    with transaction.atomic():
        WorkLog.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, token=ctx.token, note=note)


@job_handler("demo.report", version=1)
def monthly_report(ctx: JobContext) -> str:
    """Five steps, reporting progress after each; stops early if cancelled."""
    for step in range(1, 6):
        ctx.raise_if_cancelled()
        ctx.wait_for_cancel(0.05)
        ctx.report_progress(step * 20, f"step {step} of 5")
    return f"reports/{ctx.payload['month']}.csv"


@job_handler("demo.flaky", version=1, retry=NO_DELAY)
def flaky(ctx: JobContext) -> str:
    """Fails on its first ``fail_times`` attempts, then succeeds."""
    _log(ctx)
    if ctx.attempt <= int(ctx.payload.get("fail_times", 1)):
        raise RuntimeError(f"simulated outage on attempt {ctx.attempt}")
    return "delivered"


@job_handler("demo.export", version=1)
def endless_export(ctx: JobContext) -> str:
    """Runs until cancelled (or stopped by a shutdown), reporting progress."""
    done = 0.0
    while not ctx.wait_for_cancel(0.1):
        done = min(done + 1, 99)
        ctx.report_progress(done, "exporting")
    ctx.raise_if_cancelled()
    return "unreachable"


@job_handler("test.record", version=1)
def record(ctx: JobContext) -> str:
    """Write a side-effect row in its own transaction, then succeed.

    With ``hold_file`` in the payload, block until that file exists (tests use it
    to keep the handler running for as long as they need, without sleeping).
    """
    hold = ctx.payload.get("hold_file")
    if hold:
        started = ctx.payload.get("started_file")
        if started:
            Path(started).touch()
        while not Path(hold).exists():
            if ctx.wait_for_cancel(0.05) and ctx.payload.get("obey_cancel", True):
                ctx.raise_if_cancelled()
    _log(ctx, note=str(os.getpid()))
    return f"recorded {ctx.job_id}"


@job_handler("test.outage", version=1, retry=NO_DELAY)
def outage_load(ctx: JobContext) -> str:
    """The outage test's load: a short job whose effect (a ``WorkLog`` row) commits
    in its own transaction; when the database fails under it, it is retried at once
    (its attempt is finished when the database is back)."""
    ctx.wait_for_cancel(float(ctx.payload.get("seconds", 0.005)))
    _log(ctx, note=str(os.getpid()))
    return f"done {ctx.job_id}"


@job_handler("test.async", version=1)
async def async_record(ctx: JobContext) -> str:
    await asyncio.sleep(0)
    await ctx.areport_progress(50, "async halfway")
    return f"async {ctx.payload.get('n')}"


@job_handler("shop.invoice", version=1)
def render_invoice(ctx: JobContext) -> str:
    """Render an order's invoice page by page, reporting progress after each."""
    number = ctx.payload["order"]
    pages = 4
    for page in range(1, pages + 1):
        ctx.raise_if_cancelled()
        ctx.wait_for_cancel(float(os.environ.get("SHOP_INVOICE_PAGE_SECONDS", "0.05")))
        ctx.report_progress(page * 100 / pages, f"page {page} of {pages}")
    path = f"invoices/{number}.pdf"
    with transaction.atomic():
        Order.objects.filter(number=number).update(invoice=path)
    return path


@job_handler("shop.label", version=1)
def print_label(ctx: JobContext) -> str:
    """Print a shipping label (staged by the fulfilment saga's ``ship`` step)."""
    return f"labels/{ctx.payload['order']}.zpl"
