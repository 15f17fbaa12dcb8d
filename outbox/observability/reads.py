"""The outbox's reads for its database gauges and the admin's dashboard: one
query over the ``(status, event_type)`` index, however many sent messages are kept."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, QuerySet
from django.urls import reverse

from ledon.dashboard import Panel, age

from ..models import OutboxMessage
from ..types import MessageStatus


def _backlog() -> QuerySet[Any, Any]:
    return (
        OutboxMessage.objects.filter(status__in=(MessageStatus.PENDING, MessageStatus.PARKED))
        .values("status")
        .annotate(count=Count("id"), oldest=Min("created_at"))
        .order_by()
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Backlog:
    pending: int = 0
    #: When the oldest pending message was stored (None: nothing pending).
    oldest_pending_at: datetime | None = None
    parked: int = 0

    def lag(self, now: datetime) -> float:
        """Seconds the oldest pending message has waited (0 when none waits)."""
        if self.oldest_pending_at is None:
            return 0.0
        return max((now - self.oldest_pending_at).total_seconds(), 0.0)


def backlog() -> Backlog:
    rows = {row["status"]: row for row in _backlog()}
    pending = rows.get(MessageStatus.PENDING, {})
    return Backlog(
        pending=pending.get("count", 0),
        oldest_pending_at=pending.get("oldest"),
        parked=rows.get(MessageStatus.PARKED, {}).get("count", 0),
    )


#: The models the dashboard's panels summarise: a user who may view none of them in
#: the admin gets no panel, and its queries do not run.
DASHBOARD_MODELS = (OutboxMessage,)


def dashboard_panels(now: datetime) -> list[Panel]:
    state = backlog()
    return [
        Panel(
            title="Outbox",
            facts=[
                ("pending", str(state.pending)),
                ("lag (oldest pending)", age(state.lag(now)) if state.pending else "none"),
                ("parked", str(state.parked)),
            ],
            link=reverse("admin:outbox_outboxmessage_changelist"),
            attention=state.parked > 0,
            model=OutboxMessage,
        )
    ]


def queries() -> list[tuple[str, QuerySet[Any, Any]]]:
    """The queries above, named, for the EXPLAIN test."""
    return [("outbox backlog", _backlog())]
