"""Job handlers of the fulfilment demo (imported by the job worker's autodiscovery)."""

from __future__ import annotations

from django.db import transaction

from jobs import JobContext, job_handler

from .models import Shipment


@job_handler("fulfilment.dispatch", version=1)
def dispatch(ctx: JobContext) -> None:
    """Hand a shipment to the carrier (the job the saga's ``ship`` step staged)."""
    with transaction.atomic():
        Shipment.objects.filter(pk=ctx.payload["shipment_id"]).update(dispatched=True)
