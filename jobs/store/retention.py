"""Retention: deleting old finished jobs with their attempts."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from ledon.db import adapt_dt, alias_for, connection_for, is_postgres

from .. import validation
from ..db import fetch, in_list_params
from ..models import Job
from . import sql
from .base import CHUNK_ROWS


def purge_finished(*, older_than: datetime, limit: int = 1000) -> int:
    """Retention: delete up to ``limit`` finished jobs (Succeeded, Failed, Cancelled,
    Interrupted) that finished before ``older_than``, oldest first, with their attempts.

    One statement per batch — a job and its attempt history go together or not at
    all — and it reads only the index of finished jobs. A Queued or Running job is
    never touched, and neither is a job whose row another transaction holds (a retry
    under way, on PostgreSQL: ``SKIP LOCKED``); the status is checked again by the
    delete itself. Returns the number of jobs deleted.
    """
    older_than = validation.aware_utc(older_than, "older_than")
    validation.integer(limit, "limit", 1, 100_000)
    alias = alias_for(Job)
    connection = connection_for(Job)
    params = {"older_than": adapt_dt(connection, older_than), "limit": limit}
    with transaction.atomic(using=alias):
        rows = fetch(connection, sql.purge_finished(connection.vendor), params)
        if is_postgres(connection):
            return int(rows[0]["deleted"])
        ids = [row["id"] for row in rows]
        for start in range(0, len(ids), CHUNK_ROWS):
            chunk = ids[start : start + CHUNK_ROWS]
            fetch(connection, sql.delete_attempts(len(chunk)), in_list_params("job", chunk))
    return len(ids)
