"""Retention: finished top-level runs past a cutoff deleted, with what they own."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from ..conf import workflows_settings
from ..models import WorkflowRun
from .base import alias, current_time
from .waking import drop_wakes


def purge_finished(*, older_than: datetime, limit: int | None = None) -> int:
    """Delete up to ``limit`` top-level runs that finished before ``older_than``, with
    their checkpoints, items, signals and children; returns how many runs."""
    limit = limit or workflows_settings().RETENTION_BATCH
    due = WorkflowRun.objects.finished_before(older_than).filter(parent__isnull=True)
    # The look outside a transaction: a pass with nothing to delete (the usual one)
    # takes no write lock (SQLite's IMMEDIATE transactions would).
    ids = list(due.order_by("finished_at").values_list("pk", flat=True)[:limit])
    if not ids:
        return 0
    with transaction.atomic(using=alias()):
        # Re-checked under the transaction: a run resumed meanwhile is not finished.
        ids = list(due.filter(pk__in=ids).values_list("pk", flat=True))
        drop_wakes(_with_descendants(ids), current_time())
        WorkflowRun.objects.filter(pk__in=ids).delete()
    return len(ids)


def _with_descendants(run_pks: list[int]) -> list[int]:
    """``run_pks`` and the ids of all their child runs, at any depth."""
    found, level = list(run_pks), list(run_pks)
    while level:
        level = list(WorkflowRun.objects.filter(parent__in=level).values_list("pk", flat=True))
        found += level
    return found
