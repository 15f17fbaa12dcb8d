"""Queues: pause and resume, persisted in ``jobs_queue``; every claim's guard
leaves out the due jobs of a paused queue (:data:`jobs.store.sql.CLAIMABLE`), so every
worker stops claiming from it with its next claim."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Count

from ledon.db import adapt_dt, alias_for, connection_for

from .. import validation
from ..db import fetch
from ..models import Job, Queue
from ..types import JobStatus
from . import sql_flow
from .base import current_time, notify


def _set_paused(name: str, paused: bool, now: datetime | None) -> bool:
    name = validation.name(name, "queue", validation.MAX_QUEUE_LENGTH)
    now = current_time(now)
    connection = connection_for(Queue)
    statement = sql_flow.PAUSE_QUEUE if paused else sql_flow.RESUME_QUEUE
    with transaction.atomic(using=alias_for(Queue)):
        changed = bool(
            fetch(connection, statement, {"name": name, "now": adapt_dt(connection, now)})
        )
        if changed and not paused:
            notify(connection, name)  # wake the workers: its due jobs may go now
    return changed


def pause(name: str, *, now: datetime | None = None) -> bool:
    """Pause queue ``name``: no claim takes its jobs until it is resumed (Running jobs
    run on). True if it was not paused already."""
    return _set_paused(name, True, now)


def resume(name: str, *, now: datetime | None = None) -> bool:
    """Resume queue ``name``; True if it was paused."""
    return _set_paused(name, False, now)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueState:
    """A queue as operators see it (``manage.py jobs_queues list``, the admin)."""

    name: str
    queued: int
    running: int
    paused: bool


def queue_states(names: list[str] | None = None) -> list[QueueState]:
    """Every queue that has Queued or Running jobs, a stored state or is in ``names``,
    by name: its depth (Queued jobs), Running jobs and whether it is paused."""
    counts: dict[tuple[str, str], int] = {
        (row["queue"], row["status"]): row["count"]
        for row in Job.objects.filter(status__in=(JobStatus.QUEUED, JobStatus.RUNNING))
        .values("queue", "status")
        .annotate(count=Count("id"))
        .order_by()
    }
    paused = dict(Queue.objects.values_list("name", "paused"))
    every = sorted({queue for queue, _status in counts} | set(paused) | set(names or []))
    return [
        QueueState(
            name=name,
            queued=counts.get((name, JobStatus.QUEUED), 0),
            running=counts.get((name, JobStatus.RUNNING), 0),
            paused=paused.get(name, False),
        )
        for name in every
    ]
