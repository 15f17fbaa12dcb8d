"""Retention: deleting old finished jobs with their attempts."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from .. import validation
from ..db import (
    adapt_dt,
    alias_for,
    connection_for,
    is_postgres,
    placeholders,
)
from ..models import Job
from ..types import (
    FINISHED_STATUSES,
)
from .base import ATTEMPT, CHUNK_ROWS, JOB

_FINISHED_SQL = ", ".join(f"'{status.value}'" for status in FINISHED_STATUSES)


def _oldest_finished_sql(vendor: str) -> str:
    """The ids of the oldest finished jobs before a time (parameters: time, limit)."""
    lock = " FOR UPDATE SKIP LOCKED" if vendor == "postgresql" else ""
    return (
        f"SELECT id FROM {JOB} WHERE status IN ({_FINISHED_SQL}) AND finished_at < %s"
        f" ORDER BY finished_at LIMIT %s{lock}"
    )


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
    postgres = is_postgres(connection)
    oldest = _oldest_finished_sql(connection.vendor)
    params = [adapt_dt(connection, older_than), limit]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if postgres:
            # Ids as arrays: primary-key and (job, number) lookups whatever the plan's
            # estimates. The attempts' foreign key is checked at commit.
            cursor.execute(
                f"WITH gone AS (DELETE FROM {JOB} WHERE id = ANY(ARRAY({oldest}))"
                f" AND status IN ({_FINISHED_SQL}) RETURNING id),"
                f" attempts AS (DELETE FROM {ATTEMPT}"
                " WHERE job_id = ANY(ARRAY(SELECT id FROM gone)))"
                " SELECT count(*) FROM gone",
                params,
            )
            return int(cursor.fetchone()[0])
        cursor.execute(
            f"DELETE FROM {JOB} WHERE id IN ({oldest}) AND status IN ({_FINISHED_SQL})"
            " RETURNING id",
            params,
        )
        ids = [row[0] for row in cursor.fetchall()]
        for start in range(0, len(ids), CHUNK_ROWS):
            chunk = ids[start : start + CHUNK_ROWS]
            cursor.execute(
                f"DELETE FROM {ATTEMPT} WHERE job_id IN ({placeholders(len(chunk))})", chunk
            )
    return len(ids)
