"""Rules the store states twice — once for the ORM's reads, once in its raw SQL — held
equal by tests, so that neither copy can drift."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs.db import fetch
from jobs.models import Job, Queue
from jobs.store import sql
from jobs.types import JobStatus
from ledon.db import adapt_dt

pytestmark = pytest.mark.django_db


def test_the_claim_sql_and_the_queryset_vocabulary_agree_on_what_is_claimable():
    now = timezone.now()
    Queue.objects.create(name="paused", paused=True, updated_at=now)
    Queue.objects.create(name="resumed", paused=False, updated_at=now)
    combinations = itertools.product(
        [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED],
        [False, True],  # cancel requested
        [now - timedelta(seconds=1), now, now + timedelta(seconds=1)],  # next_run_at
        [(0, 1), (1, 2), (2, 2)],  # attempt_count, max_attempts
        ["default", "paused", "resumed"],
    )
    Job.objects.bulk_create(
        Job(
            scope_hash="a" * 64,
            job_id=f"job-{n}",
            handler="reports.generate",
            handler_version=1,
            payload_json="{}",
            status=status,
            cancel_requested=cancel,
            next_run_at=due,
            attempt_count=used,
            max_attempts=allowed,
            queue=queue,
            created_at=now,
            updated_at=now,
        )
        for n, (status, cancel, due, (used, allowed), queue) in enumerate(combinations)
    )
    by_sql = {
        row["id"]
        for row in fetch(
            connection,
            f"SELECT id FROM {sql.JOB} WHERE {' AND '.join(sql.CLAIMABLE)}",
            {"now": adapt_dt(connection, now)},
        )
    }
    by_queryset = set(Job.objects.due(now).unpaused().values_list("id", flat=True))
    # Queued, no cancel, due (now included), attempts left, queue not paused.
    assert len(by_sql) == 2 * 2 * 2
    assert by_sql == by_queryset


def test_every_statement_that_leaves_running_gives_up_the_token_and_the_lease():
    from jobs.store import sql_flow

    leaving = {
        "finish (both databases)": sql.finish(),
        "finish, SQLite": sql.finish_jobs_sqlite(1),
        "snooze": sql_flow.SNOOZE_JOB,
        "put back": sql_flow.PUT_BACK_UNKNOWN_HANDLER,
    }
    for name, statement in leaving.items():
        assert sql.LEAVE_RUNNING in statement, name
    assert sql.LEAVE_RUNNING == "current_token = NULL, leased_by = '', lease_expires_at = NULL"
