"""The workflows' panel on the admin's dashboard: runs by status, what the waiting
runs wait for, and the latest failed runs."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from django.db.models import Count
from django.urls import reverse

from ledon.dashboard import Cell, Panel, age

from ..models import WorkflowRun
from ..types import RunStatus, WaitKind

#: The models whose view permission shows the panel.
DASHBOARD_MODELS = (WorkflowRun,)
#: Failed runs listed on the dashboard at most.
LISTED = 10


def waiting_reason(wait_kind: str) -> str:
    """What a run of ``wait_kind`` (a :class:`~workflows.types.WaitKind`, or "" for
    none) waits for, as the dashboard says it: "signal", "items", "a new advance"…"""
    return str(WaitKind(wait_kind).label) if wait_kind else "its next advance"


def dashboard_panels(now: datetime) -> list[Panel]:
    by_status = dict.fromkeys(RunStatus, 0)
    for row in WorkflowRun.objects.values("status").annotate(count=Count("id")).order_by():
        by_status[RunStatus(row["status"])] += row["count"]
    reasons: Counter[str] = Counter()
    for wait_kind, count in (
        WorkflowRun.objects.filter(status=RunStatus.WAITING)
        .values("wait_kind")
        .annotate(count=Count("id"))
        .values_list("wait_kind", "count")
        .order_by()
    ):
        reasons[waiting_reason(wait_kind)] += count
    failed = list(
        WorkflowRun.objects.filter(status=RunStatus.FAILED)
        .only("id", "name", "run_id", "failed_step", "finished_at", "updated_at")
        .order_by("-updated_at", "-id")[:LISTED]
    )
    changelist = reverse("admin:workflows_workflowrun_changelist")
    facts = [(status.label.lower(), str(by_status[status])) for status in RunStatus]
    facts += [(f"waiting for {reason}", str(count)) for reason, count in reasons.most_common()]
    return [
        Panel(
            title="Workflow runs",
            facts=facts,
            headers=["workflow", "failed run", "failed step", "since"],
            rows=[
                [
                    Cell(run.name),
                    Cell(run.run_id, reverse("admin:workflows_workflowrun_change", args=[run.pk])),
                    Cell(run.failed_step or "-"),
                    Cell(age((now - (run.finished_at or run.updated_at)).total_seconds())),
                ]
                for run in failed
            ],
            link=changelist,
            attention=by_status[RunStatus.FAILED] > 0,
        )
    ]
