"""Fair share's state for operators: each scope's weight (``jobs_scopeweight``) and,
per queue and scope with work, its Queued and Running jobs. Places in line are taken
at submit (:mod:`jobs.store.submission`, :mod:`jobs.fair_share`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Count

from ledon.db import alias_for

from ..fair_share import check_weight
from ..models import Job, ScopeWeight
from ..types import JobStatus
from .base import current_time


def set_weight(scope_hash: str, weight: object, *, now: datetime | None = None) -> float:
    """Give scope ``scope_hash`` the share ``weight`` of every fair queue's starts (1 is
    the default); the jobs it submits from now on take their places by it. Returns the
    weight it had. A weight outside (0, 100] is :class:`~jobs.exceptions.InvalidWeight`
    and writes nothing."""
    value = check_weight(weight)
    now = current_time(now)
    with transaction.atomic(using=alias_for(ScopeWeight)):
        row = ScopeWeight.objects.select_for_update().filter(scope_hash=scope_hash).first()
        before = 1.0 if row is None else row.weight
        ScopeWeight.objects.update_or_create(
            scope_hash=scope_hash, defaults={"weight": value, "updated_at": now}
        )
    return before


@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeShare:
    """One scope's work in one queue, as operators see it (the admin,
    ``manage.py jobs_queues scopes``)."""

    queue: str
    scope_hash: str
    weight: float
    queued: int
    running: int


def scope_shares(queue: str | None = None) -> list[ScopeShare]:
    """Every (queue, scope) with Queued or Running jobs — in ``queue`` only if given —,
    by queue, then most Queued first: the scope's weight and its jobs."""
    jobs = Job.objects.filter(status__in=(JobStatus.QUEUED, JobStatus.RUNNING))
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for row in jobs.values("queue", "scope_hash", "status").annotate(n=Count("id")).order_by():
        counts.setdefault((row["queue"], row["scope_hash"]), {})[row["status"]] = row["n"]
    weights = dict(
        ScopeWeight.objects.filter(scope_hash__in={key[1] for key in counts}).values_list(
            "scope_hash", "weight"
        )
    )
    shares = [
        ScopeShare(
            queue=queue_name,
            scope_hash=scope_hash,
            weight=weights.get(scope_hash, 1.0),
            queued=by_status.get(JobStatus.QUEUED, 0),
            running=by_status.get(JobStatus.RUNNING, 0),
        )
        for (queue_name, scope_hash), by_status in counts.items()
    ]
    shares.sort(key=lambda share: (share.queue, -share.queued, share.scope_hash))
    return shares
