"""Start deadlines: a Queued job whose ``start_by`` passed is never claimed (the
claim's guard, :data:`jobs.store.sql.CLAIMABLE`); this sweep ends it Expired —
final, no attempt used — in bounded batches that skip what another transaction
holds."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from ledon.db import alias_for, connection_for

from .. import validation
from ..models import Job
from . import sql_flow
from .base import current_time
from .endings import run_moving
from .sql import QUEUED

#: The error an expired job keeps.
EXPIRED_ERROR = "expired: not started by its start deadline"


def expire_due(*, limit: int = 1000, now: datetime | None = None) -> list[tuple[str, str]]:
    """End up to ``limit`` Queued jobs whose start deadline is at or before ``now``
    Expired, one statement (with what follows in their batches and sequences, see
    :mod:`jobs.store.endings`); returns each one's (queue, handler)."""
    validation.integer(limit, "limit", 1, 100_000)
    now = current_time(now)
    connection = connection_for(Job)
    params = {"limit": limit, "error": EXPIRED_ERROR}
    with transaction.atomic(using=alias_for(Job)):
        statement = sql_flow.expire_jobs(connection.vendor)
        rows = run_moving(connection, statement, params, now, was=QUEUED)
    return [(row["queue"], row["handler"]) for row in rows]
