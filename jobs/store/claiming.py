"""Claiming: Queued -> Running with a new token and its attempt row (J6), alone or
after finishing a batch of attempts in the same transaction."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from .. import validation
from ..conf import jobs_settings
from ..db import (
    adapt_dt,
    alias_for,
    connection_for,
    fetch,
    is_postgres,
    placeholders,
    random_token_sql,
    read_dt,
)
from ..models import Job
from ..types import (
    AttemptStatus,
    Claim,
    FinishOutcome,
    JobStatus,
)
from .base import ATTEMPT, JOB, check_result_ref, current_time
from .finishing import complete_rows, finish_ctes, finished_outcomes

_CLAIM_RETURNING = (
    "id, scope_hash, job_id, current_token, attempt_count, max_attempts, handler,"
    " handler_version, payload_json, queue, priority, next_run_at, leased_by, started_at"
)
_ATTEMPT_INSERT = (
    f"INSERT INTO {ATTEMPT} (job_id, number, token, status, worker_id, progress,"
    " progress_message, error, result_ref, started_at, finished_at)"
)


@functools.lru_cache(maxsize=64)
def _claim_sql(vendor: str, *, queues: int, one_job: bool, finishing: bool = False) -> str:
    """The claim: one guarded UPDATE of up to LIMIT due jobs, returning them.

    On PostgreSQL the same statement also inserts each claimed job's Running attempt
    row (a data-modifying CTE), so a claim is one round trip; on SQLite the attempt
    rows follow as a second statement of the same transaction. With ``finishing``
    (PostgreSQL only), the statement first completes a batch of attempts — see
    :func:`finish_ctes` — and every row it returns starts with its kind: ``'f'`` (a
    finished token), ``'m'`` (a token whose attempt row is missing: then the statement
    changes nothing at all) or ``'c'`` (a claimed job). Being one statement, it is
    atomic by itself: the worker runs it in autocommit, one round trip in all.
    """
    filters = [
        # Literals, not parameters, so that even a generic plan of the prepared
        # statement can prove the due index's predicate and use it.
        f"status = '{JobStatus.QUEUED.value}'",
        "NOT cancel_requested",
        "next_run_at <= %s",
        "attempt_count < max_attempts",
    ]
    if queues:
        filters.append(f"queue IN ({placeholders(queues)})")
    if one_job:
        filters.append("scope_hash = %s AND job_id = %s")
    postgres = vendor == "postgresql"
    lock = " FOR UPDATE SKIP LOCKED" if postgres else ""
    # PostgreSQL: the chosen ids as an array, so that the update finds them by primary
    # key whatever the plan's row estimate (an IN sub-select may be planned as a
    # hash join over the whole table).
    chosen, close = ("= ANY(ARRAY", ")") if postgres else ("IN", "")
    guard = "NOT EXISTS (SELECT 1 FROM orphans) AND " if finishing else ""
    update = (
        f"UPDATE {JOB} SET status = '{JobStatus.RUNNING.value}',"
        " attempt_count = attempt_count + 1,"
        f" current_token = {random_token_sql(vendor)},"
        " leased_by = %s, lease_expires_at = %s, started_at = %s, updated_at = %s,"
        " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
        " finished_at = NULL"
        f" WHERE {guard}id {chosen} (SELECT id FROM {JOB} WHERE {' AND '.join(filters)}"
        f" ORDER BY priority DESC, next_run_at, id LIMIT %s{lock}){close}"
        f" RETURNING {_CLAIM_RETURNING}"
    )
    if not postgres:
        return update
    ctes = (
        f"claimed AS ({update}),"
        f" attempts AS ({_ATTEMPT_INSERT} SELECT id, attempt_count, current_token,"
        f" '{AttemptStatus.RUNNING.value}', leased_by, NULL, '', '', NULL, started_at, NULL"
        " FROM claimed)"
    )
    if not finishing:
        return f"WITH {ctes} SELECT {_CLAIM_RETURNING} FROM claimed"
    blanks = ", ".join(["NULL"] * 14)
    return (
        f"WITH {finish_ctes()}, {ctes}"
        f" SELECT 'f', token, status, token IN (SELECT token FROM finished_attempts), {blanks}"
        " FROM finished"
        f" UNION ALL SELECT 'c', NULL, NULL, NULL, {_CLAIM_RETURNING} FROM claimed"
        # Last: a union takes its column types from the branches before.
        f" UNION ALL SELECT 'm', token, NULL, NULL, {blanks} FROM orphans"
    )


def _claim_rows(
    connection: BaseDatabaseWrapper,
    worker_id: str,
    *,
    limit: int,
    queue_list: list[str],
    identity: tuple[str, str] | None,
    expires: datetime,
    now: datetime,
    finishing: Sequence[tuple[Claim, str | None]] = (),
) -> tuple[dict[str, FinishOutcome], list[Claim]]:
    """Claim inside the caller's transaction (see :func:`claim`); on PostgreSQL, also
    complete ``finishing`` in the same statement (see :func:`finish_ctes`)."""
    now_db = adapt_dt(connection, now)
    params: list[Any] = []
    if finishing:
        tokens = [claim.token for claim, _ in finishing]
        results = [result for _, result in finishing]
        params.extend([tokens, results, tokens, now_db, now_db, tokens, now_db])
    params.extend([worker_id, adapt_dt(connection, expires), now_db, now_db, now_db, *queue_list])
    if identity is not None:
        params.extend(identity)
    params.append(limit)
    sql = _claim_sql(
        connection.vendor,
        queues=len(queue_list),
        one_job=identity is not None,
        finishing=bool(finishing),
    )
    outcomes: dict[str, FinishOutcome] = {}
    rows = fetch(connection, sql, params)
    if finishing:
        outcomes = finished_outcomes(finishing, rows)
        rows = [r[4:] for r in rows if r[0] == "c"]
    if rows and not is_postgres(connection):
        with connection.cursor() as cursor:
            cursor.execute(
                f"{_ATTEMPT_INSERT} VALUES "
                + ", ".join(["(%s, %s, %s, %s, %s, NULL, '', '', NULL, %s, NULL)"] * len(rows)),
                [
                    value
                    for r in rows
                    for value in (r[0], r[4], r[3], AttemptStatus.RUNNING.value, worker_id, now_db)
                ],
            )
    if len(rows) > 1:
        rows.sort(key=lambda r: (-r[10], read_dt(r[11]), r[0]))
    claims = [
        Claim(
            scope_hash=r[1],
            job_id=r[2],
            token=r[3],
            attempt=r[4],
            max_attempts=r[5],
            handler=r[6],
            handler_version=r[7],
            payload_json=r[8],
            queue=r[9],
            worker_id=worker_id,
            lease_expires_at=expires,
        )
        for r in rows
    ]
    return outcomes, claims


def claim(
    worker_id: str,
    *,
    limit: int,
    queues: Sequence[str] | None = None,
    lease_seconds: float | None = None,
    identity: tuple[str, str] | None = None,
    now: datetime | None = None,
) -> list[Claim]:
    """J6: start up to ``limit`` due jobs in one transaction; each gets a new token.

    Per job it is the same guarded change as ``try_start``: Queued, no cancel
    requested, due, attempts left -> Running with attempt n+1 and its Running
    attempt row; both or neither. On PostgreSQL, ``SKIP LOCKED`` lets many workers
    claim from one queue without waiting for each other.
    """
    validation.integer(limit, "limit", 1, 10_000)
    return complete_and_claim(
        (),
        worker_id,
        limit=limit,
        queues=queues,
        lease_seconds=lease_seconds,
        identity=identity,
        now=now,
    )[1]


def complete_many(
    completions: Sequence[tuple[Claim, str | None]], *, now: datetime | None = None
) -> dict[str, FinishOutcome]:
    """J8 ``complete`` for several attempts in one transaction: ``(claim, result_ref)``
    pairs in, each token's outcome out.

    Every attempt is finished exactly as :func:`finish` would finish it alone — only
    if its token is current and its job Running; Cancelled, result dropped, if a cancel
    request committed first; its attempt row in the same transaction — but the batch
    shares one commit. A stale token is ``STALE`` and changes nothing; a missing
    attempt row fails the whole batch (``AttemptRowMissing``), which changes nothing.
    """
    return complete_and_claim(completions, "", limit=0, now=now)[0]


def complete_and_claim(
    completions: Sequence[tuple[Claim, str | None]],
    worker_id: str,
    *,
    limit: int,
    queues: Sequence[str] | None = None,
    lease_seconds: float | None = None,
    identity: tuple[str, str] | None = None,
    now: datetime | None = None,
) -> tuple[dict[str, FinishOutcome], list[Claim]]:
    """A worker's round trip: finish ``completions`` as :func:`complete_many` does, then
    claim up to ``limit`` due jobs as :func:`claim` does — one transaction, one commit.

    The two parts keep their own guards and outcomes; sharing the commit only means
    that either both take effect or neither does. On PostgreSQL they are one
    statement, run in autocommit when the caller has no transaction open.
    """
    checked = [(claim, check_result_ref(result)) for claim, result in completions]
    validation.integer(limit, "limit", 0, 10_000)
    if limit:
        worker_id = validation.text(worker_id, "worker_id", validation.MAX_NAME_LENGTH)
    if not checked and not limit:
        return {}, []
    now = current_time(now)
    expires = now + timedelta(seconds=lease_seconds or jobs_settings().LEASE_SECONDS)
    alias = alias_for(Job)
    connection = connection_for(Job)
    claim_rows = functools.partial(
        _claim_rows,
        connection,
        worker_id,
        limit=limit,
        queue_list=list(queues or []),
        identity=identity,
        expires=expires,
        now=now,
    )
    if is_postgres(connection):
        # One statement finishes and claims (LIMIT 0 claims nothing); it is atomic by
        # itself, so in autocommit it is its own transaction: one round trip.
        if connection.get_autocommit():
            return claim_rows(finishing=checked)
        with transaction.atomic(using=alias):
            return claim_rows(finishing=checked)
    # SQLite has no data-modifying CTEs: the completion statements come first.
    with transaction.atomic(using=alias):
        outcomes = complete_rows(connection, checked, now) if checked else {}
        if not limit:
            return outcomes, []
        finished, claims = claim_rows()
    return outcomes | finished, claims
