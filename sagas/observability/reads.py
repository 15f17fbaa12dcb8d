"""The sagas' reads for their database gauges and the admin's dashboard: the
instances that are not final, through the ``(status, name)`` index."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, QuerySet
from django.urls import reverse

from ledon.dashboard import Cell, Panel, age

from ..models import SagaInstance
from ..types import SagaStatus

#: The statuses read (an instance stays in them for a while, or for good).
OPEN_STATUSES = (SagaStatus.RUNNING, SagaStatus.COMPENSATING, SagaStatus.FAILED)
#: Instances needing attention listed on the dashboard at most.
LISTED = 10


def open_instances() -> QuerySet[Any, Any]:
    """Running, compensating and failed instances, counted per saga and status."""
    return (
        SagaInstance.objects.filter(status__in=OPEN_STATUSES)
        .values("name", "status")
        .annotate(count=Count("id"))
        .order_by()
    )


def _needing_attention() -> QuerySet[SagaInstance]:
    return SagaInstance.objects.needs_attention().order_by("-updated_at", "-id")


#: The models the dashboard's panels summarise: a user who may view none of them in
#: the admin gets no panel, and its queries do not run.
DASHBOARD_MODELS = (SagaInstance,)


def dashboard_panels(now: datetime) -> list[Panel]:
    counts = {status: 0 for status in OPEN_STATUSES}
    for row in open_instances():
        counts[SagaStatus(row["status"])] += row["count"]
    failed = list(
        _needing_attention().only("id", "name", "instance_id", "failed_step", "updated_at")[:LISTED]
    )
    return [
        Panel(
            title="Sagas needing attention",
            facts=[
                ("needing attention", str(counts[SagaStatus.FAILED])),
                ("running", str(counts[SagaStatus.RUNNING])),
                ("compensating", str(counts[SagaStatus.COMPENSATING])),
            ],
            headers=["saga", "instance", "failed step", "since"],
            rows=[
                [
                    Cell(instance.name),
                    Cell(
                        str(instance.instance_id),
                        reverse("admin:sagas_sagainstance_change", args=[instance.pk]),
                    ),
                    Cell(instance.failed_step or "-"),
                    Cell(age((now - instance.updated_at).total_seconds())),
                ]
                for instance in failed
            ],
            link=reverse("admin:sagas_sagainstance_changelist") + "?status__exact=failed",
            attention=counts[SagaStatus.FAILED] > 0,
            model=SagaInstance,
        )
    ]


def queries() -> list[tuple[str, QuerySet[Any, Any]]]:
    return [
        ("open saga instances", open_instances()),
        ("sagas needing attention", _needing_attention()[:LISTED]),
    ]
