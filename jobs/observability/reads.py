"""The reads behind the jobs' database gauges and the admin's dashboard.

Each is one query that an index answers however much finished history the table
holds: the Queued and Running rows are read through the partial indexes that claiming
and finishing already keep (``jobs_job_line_idx``, ``jobs_job_current_token``), the last
hour's finished jobs through ``jobs_job_finished_idx``, workers and schedules are small
tables. :func:`queries` lists them for the EXPLAIN test (``tests/ledon/test_observability_cost``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q, QuerySet
from django.db.models.functions import TruncMinute

from ..conf import jobs_settings
from ..models import Batch, Job, Queue, Sequence
from ..schedules.models import Schedule
from ..types import JobStatus
from .models import WorkerRecord
from .worker_registry import silent_after


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueState:
    queue: str
    queued: int = 0
    running: int = 0
    #: When the longest-waiting due job became due (None: nothing is due).
    oldest_due_at: datetime | None = None

    def oldest_due_age(self, now: datetime) -> float:
        """Seconds the oldest due job has waited (0 when none is due)."""
        if self.oldest_due_at is None:
            return 0.0
        return max((now - self.oldest_due_at).total_seconds(), 0.0)


def _queued(now: datetime) -> QuerySet[Any, Any]:
    # The line index's rows (Queued, not held by its sequence; a Queued job has no
    # cancel requested): PostgreSQL reads the index instead of the table. A held job waits
    # apart, behind an earlier job of its sequence: it is not in line yet.
    return (
        Job.objects.filter(status=JobStatus.QUEUED, cancel_requested=False, sequence_held=False)
        .values("queue")
        .annotate(
            queued=Count("id"),
            oldest_due_at=Min("next_run_at", filter=Q(next_run_at__lte=now)),
        )
        .order_by()
    )


def _running() -> QuerySet[Any, Any]:
    return Job.objects.running().values("queue").annotate(running=Count("id")).order_by()


def queue_states(now: datetime) -> list[QueueState]:
    """Queued and running jobs per queue, and the oldest due job's due time."""
    states: dict[str, dict[str, Any]] = {}
    for row in _queued(now):
        states.setdefault(str(row["queue"]), {}).update(row)
    for row in _running():
        states.setdefault(str(row["queue"]), {}).update(row)
    return [
        QueueState(
            queue=queue,
            queued=int(values.get("queued") or 0),
            running=int(values.get("running") or 0),
            oldest_due_at=values.get("oldest_due_at"),
        )
        for queue, values in sorted(states.items())
    ]


def _finished_since(since: datetime) -> QuerySet[Any, Any]:
    return (
        Job.objects.filter(finished_at__gte=since)
        .annotate(minute=TruncMinute("finished_at"))
        .values("queue", "minute", "status")
        .annotate(count=Count("id"))
        .order_by()
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    """Jobs that finished per minute over a window, per queue: ``succeeded[queue]`` and
    ``failed[queue]`` are lists of counts, oldest minute first."""

    minutes: list[datetime]
    succeeded: dict[str, list[int]]
    failed: dict[str, list[int]]
    #: Cancelled and interrupted jobs in the window, per queue.
    other: dict[str, int]


def throughput(now: datetime, minutes: int = 60) -> Throughput:
    """Finished jobs per minute and queue over the last ``minutes`` (the current,
    incomplete minute last)."""
    end = now.replace(second=0, microsecond=0)
    buckets = [end - timedelta(minutes=n) for n in range(minutes - 1, -1, -1)]
    index = {minute: n for n, minute in enumerate(buckets)}
    succeeded: dict[str, list[int]] = {}
    failed: dict[str, list[int]] = {}
    other: dict[str, int] = {}
    for row in _finished_since(buckets[0]):
        queue = str(row["queue"])
        position = index.get(row["minute"])
        count = int(row["count"])
        if row["status"] == JobStatus.SUCCEEDED and position is not None:
            succeeded.setdefault(queue, [0] * minutes)[position] += count
        elif row["status"] == JobStatus.FAILED and position is not None:
            failed.setdefault(queue, [0] * minutes)[position] += count
        else:
            other[queue] = other.get(queue, 0) + count
    for queue in set(succeeded) | set(failed):
        succeeded.setdefault(queue, [0] * minutes)
        failed.setdefault(queue, [0] * minutes)
    return Throughput(minutes=buckets, succeeded=succeeded, failed=failed, other=other)


def _oldest_waiting(now: datetime) -> QuerySet[Job]:
    return Job.objects.due(now).order_by("next_run_at", "id")


def oldest_waiting(now: datetime) -> Job | None:
    """The due job that has waited longest."""
    return _oldest_waiting(now).only("id", "job_id", "handler", "queue", "next_run_at").first()


def workers(now: datetime) -> tuple[list[WorkerRecord], list[WorkerRecord]]:
    """The registry's rows: (heard from, silent), each by kind and id. A row heard
    from may still say its engine is unhealthy (``unhealthy_since``)."""
    after = silent_after()
    rows = list(WorkerRecord.objects.order_by("kind", "engine_id"))
    cutoff = now - after
    return (
        [r for r in rows if r.last_heartbeat_at >= cutoff],
        [r for r in rows if r.last_heartbeat_at < cutoff],
    )


#: The states of a registry row: heard from and working, heard from but saying its
#: database steps fail, not heard from for ``WORKERS_SILENT_AFTER`` heartbeats.
WORKER_STATES = ("live", "unhealthy", "silent")


def worker_counts(now: datetime) -> dict[tuple[str, str], int]:
    """Registry rows per (kind, state), the state one of :data:`WORKER_STATES`."""
    cutoff = now - silent_after()
    heard = Q(last_heartbeat_at__gte=cutoff)
    rows = (
        WorkerRecord.objects.values("kind")
        .annotate(
            live=Count("id", filter=heard & Q(unhealthy_since__isnull=True)),
            unhealthy=Count("id", filter=heard & Q(unhealthy_since__isnull=False)),
            silent=Count("id", filter=Q(last_heartbeat_at__lt=cutoff)),
        )
        .order_by()
    )
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        kind = str(row["kind"])
        counts[(kind, "live")] = int(row["live"])
        counts[(kind, "unhealthy")] = int(row["unhealthy"])
        counts[(kind, "silent")] = int(row["silent"])
    return counts


#: The kinds of engine every deployment with workers may have, whose
#: ``ledon_workers`` series read 0 rather than disappear when none runs.
ENGINE_KINDS = ("worker", "dispatcher", "consumer", "saga runner")


def known_queues() -> set[str]:
    """The queues known without a job in them: ``default``, those ``JOBS["QUEUES"]``
    limits, those paused or resumed (``jobs_queue``) and those a worker of the
    registry was started for (two small tables)."""
    names = {"default", *jobs_settings().QUEUES}
    names.update(Queue.objects.values_list("name", flat=True))
    for queues in WorkerRecord.objects.filter(kind="worker").values_list("queues", flat=True):
        names.update(str(name) for name in queues or ())
    return names


def batch_counts() -> dict[str, int]:
    """Batches by state: "open" (a job of it is not final; through the partial index of
    open batches) and "done"."""
    total = Batch.objects.count()
    still_open = Batch.objects.filter(pending__gt=0).count()
    return {"open": still_open, "done": total - still_open}


def halted_sequences() -> int:
    """Sequences halted by a Failed job, waiting for an operator (a partial index)."""
    return Sequence.objects.filter(halted_by__isnull=False).count()


def next_schedules(limit: int = 10) -> list[Schedule]:
    """The schedules whose next period comes first (paused ones last)."""
    return list(Schedule.objects.order_by("paused", "next_run_at", "name")[:limit])


def queries(now: datetime) -> Iterator[tuple[str, QuerySet[Any, Any]]]:
    """Every query on ``jobs_job`` above, named, for the EXPLAIN test."""
    yield "queued per queue", _queued(now)
    yield "running per queue", _running()
    yield "finished in the last hour", _finished_since(now - timedelta(hours=1))
    yield "oldest waiting job", _oldest_waiting(now)[:1]
