"""Claiming: Queued -> Running with a new token and its attempt row, alone or
after finishing a batch of attempts in the same transaction (see
:mod:`jobs.store.finishing`).

A claim no limit applies to is one statement (:func:`jobs.store.sql.claim`); a claim
under limits locks, then counts, picks and claims in one transaction — on
PostgreSQL one statement after the locks, all in one round trip (see
:mod:`jobs.store.limits`). Either skips paused queues in its guard.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import IntegrityError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import adapt_dt, alias_for, connection_for, is_postgres, read_dt
from ledon.faults import fault_point

from .. import validation
from ..conf import jobs_settings
from ..db import fetch, fetch_results, in_list_params, numbered
from ..flow_control import NO_LIMITS, ClaimLimits
from ..models import Job
from ..types import Claim, FinishOutcome
from . import sql, sql_endings, sql_flow
from .base import current_time
from .endings import follow, release_params
from .finishing import (
    Finished,
    Finishing,
    complete_many,
    completions,
    finish_batch,
    finishing_params,
    outcomes,
    read_finished,
)
from .limits import (
    choose,
    claim_keys,
    claim_locked,
    read_usage,
    record_starts,
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
    finishing: Sequence[Finishing] = (),
    chosen: Sequence[int] | None = None,
    limits: ClaimLimits = NO_LIMITS,
    commit: bool = False,
    counted: bool = False,
    release: Sequence[tuple[str, str]] = (),
) -> tuple[dict[str, Finished], list[Claim], bool]:
    """Claim inside the caller's transaction (see :func:`complete_and_claim`); on
    PostgreSQL, first finish ``finishing`` in the same statement (the finishing rule of
    :func:`sql.finish`).
    With ``chosen``, claim those jobs (picked under limits, SQLite) instead of the
    first due. With ``limits`` (PostgreSQL), the claim under limits of
    :func:`jobs.store.limits.claim_locked`, ``commit`` ending its transaction in the
    same round trip; the third value says whether a limit refused a candidate. With
    ``counted`` too, the plain claim that counts instead (see :func:`_claim_counted`).

    With ``release`` (PostgreSQL, a claim without limits in autocommit that finishes
    jobs of those sequences — scope hash, key —, all successes: none halts), the
    statement is its own transaction with the release of each sequence's next job
    after it (:data:`jobs.store.sql_endings.RELEASE`), in one round trip: ``BEGIN``,
    the statement, the release, ``COMMIT``."""
    if chosen is not None and not chosen:
        return {}, [], False
    now_db = adapt_dt(connection, now)
    params: dict[str, Any] = {
        "worker_id": worker_id,
        "lease_expires_at": adapt_dt(connection, expires),
        "now": now_db,
        "limit": limit,
        **in_list_params("queue", queue_list),
    }
    if identity is not None:
        params["scope_hash"], params["job_id"] = identity
    if finishing:
        params.update(finishing_params(connection, finishing, now))
    skipped = False
    if limits:
        keys, limit_params = claim_keys(connection, limits, now)
        params.update(limit_params)
        build = sql_flow.counted_claim if counted else sql_flow.limited_claim
        statement = build(
            queues=len(queue_list),
            one_job=identity is not None,
            finishing=bool(finishing),
            keys=keys,
        )
        if counted:
            rows = fetch(connection, statement, params, prepare=True)
        else:
            rows = claim_locked(connection, statement, params, commit=commit)
            skipped = any(row["kind"] == "skipped" for row in rows)
    else:
        by_ids = 0
        if chosen is not None:
            params.update(in_list_params("id", chosen))
            by_ids = len(chosen)
        statement = sql.claim(
            connection.vendor,
            queues=len(queue_list),
            one_job=identity is not None,
            finishing=bool(finishing),
            chosen=by_ids,
        )
        if release:
            params.update(release_params(release))
            statements = [statement, sql_endings.RELEASE, sql_flow.COMMIT]
            with transaction.atomic(using=connection.alias):
                rows = fetch_results(connection, statements, params, prepare=statements[:2])[0]
        else:
            rows = fetch(connection, statement, params, prepare=True)
    finished: dict[str, Finished] = {}
    if finishing:
        finished = read_finished(cast(list[sql.FinishedRow], rows))
        if not release:
            # The statement counted their batches; their sequences release the next here.
            follow(connection, [job.moved() for job in finished.values()], now, counted=True)
    if finishing or limits:
        rows = [row for row in rows if row["kind"] == "claimed"]
    if rows and not is_postgres(connection):
        attempts = [
            {"job_id": row["id"], "number": row["number"], "token": row["token"]} for row in rows
        ]
        fetch(
            connection,
            sql.insert_attempts(len(rows)),
            {**numbered(attempts), "worker_id": worker_id, "now": now_db},
        )
    if len(rows) > 1:
        rows.sort(key=lambda row: (-row["priority"], row["fair_at"], row["id"]))
    claims = [
        Claim(
            **{name: row[name] for name in sql.CLAIM_FIELDS},
            worker_id=worker_id,
            lease_expires_at=expires,
            due_at=read_dt(row["next_run_at"]),
            started_at=read_dt(row["started_at"]),
        )
        for row in rows
    ]
    return finished, claims, skipped


ClaimRows = functools.partial[tuple[dict[str, Finished], list[Claim], bool]]


def _over_cap(error: IntegrityError) -> bool:
    """Whether ``error`` is a limit counter taken past its cap: a limit binds."""
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == sql.COUNTER_CAP


def _claim_counted(
    claim_rows: ClaimRows,
    connection: BaseDatabaseWrapper,
    alias: str,
    limits: ClaimLimits,
    finishing: Sequence[Finishing],
) -> tuple[dict[str, Finished], list[Claim]] | None:
    """PostgreSQL: the claim under limits without locks or reads of usage — the plain
    claim's choice, counted (:func:`jobs.store.sql_flow.counted_claim`), one statement
    in autocommit (in the caller's transaction, behind a savepoint). None if a limit
    binds: the statement failed on a counter's cap and changed nothing."""
    try:
        if connection.get_autocommit():
            finished, claims, _ = claim_rows(finishing=finishing, limits=limits, counted=True)
        else:
            with transaction.atomic(using=alias):
                finished, claims, _ = claim_rows(finishing=finishing, limits=limits, counted=True)
    except IntegrityError as error:
        if not _over_cap(error):
            raise
        return None
    return finished, claims


#: How many times a claim under locks is made again when a counted claim, which takes
#: no lock, filled a counter between its read and its change.
_LOCKED_TRIES = 5


def _claim_limited_postgres(
    claim_rows: ClaimRows,
    connection: BaseDatabaseWrapper,
    alias: str,
    limits: ClaimLimits,
    limit: int,
    finishing: Sequence[Finishing],
) -> tuple[dict[str, Finished], list[Claim]]:
    """PostgreSQL: the claim under limits of :mod:`jobs.store.limits` — locks,
    then one statement that finishes ``finishing``, counts, picks and claims — in one
    round trip with its transaction's BEGIN and COMMIT (inside the caller's
    transaction, without the COMMIT). Should a limit refuse a candidate while the
    claim is short, the claim goes on with the rest, in a transaction of its own,
    until it is full, no limit refuses one, or a claim takes none.

    Without a rate, the claim is first made counted (:func:`_claim_counted`): when no
    limit binds, that is all."""
    if not any(value.rate for value in (*limits.handlers.values(), *limits.queues.values())):
        quick = _claim_counted(claim_rows, connection, alias, limits, finishing)
        if quick is not None:
            return quick
    finished: dict[str, Finished] = {}
    claims: list[Claim] = []
    tries = 0
    while len(claims) < limit:
        commit = connection.get_autocommit()
        try:
            with transaction.atomic(using=alias):
                page_finished, page, skipped = claim_rows(
                    limit=limit - len(claims), finishing=finishing, limits=limits, commit=commit
                )
        except IntegrityError as error:
            tries += 1
            if not _over_cap(error) or tries >= _LOCKED_TRIES:
                raise
            continue
        finished = finished or page_finished
        finishing = ()
        claims.extend(page)
        if not skipped or not page:
            break
    return finished, claims


def _claim_limited_sqlite(
    claim_rows: ClaimRows,
    connection: BaseDatabaseWrapper,
    limits: ClaimLimits,
    limit: int,
    queue_list: list[str],
    identity: tuple[str, str] | None,
    now: datetime,
) -> list[Claim]:
    """SQLite, inside the caller's IMMEDIATE transaction: count, pick, claim,
    and record the rate starts (see :mod:`jobs.store.limits`)."""
    usage = read_usage(connection, limits, now)
    if usage.room_for(limit):
        # No limit can be reached by `limit` more starts: the plain claim's choice.
        _, claims, _ = claim_rows()
        record_starts(connection, limits, claims, now)
        return claims
    base: dict[str, Any] = {"now": adapt_dt(connection, now), **in_list_params("queue", queue_list)}
    if identity is not None:
        base["scope_hash"], base["job_id"] = identity
    chosen = choose(
        connection,
        usage,
        limit=limit,
        base_params=base,
        queues=len(queue_list),
        one_job=identity is not None,
    )
    _, claims, _ = claim_rows(chosen=chosen)
    record_starts(connection, limits, claims, now)
    return claims


def complete_and_claim(
    completed: Sequence[tuple[Claim, str | None]],
    worker_id: str,
    *,
    limit: int,
    queues: Sequence[str] | None = None,
    lease_seconds: float | None = None,
    identity: tuple[str, str] | None = None,
    limits: ClaimLimits = NO_LIMITS,
    now: datetime | None = None,
) -> tuple[dict[str, FinishOutcome], list[Claim]]:
    """A worker's round trip: finish ``completed`` as :func:`complete_many`
    does, then start up to ``limit`` due jobs — one transaction, one commit; each new
    claim gets a new token. With nothing to finish it is the claim alone
    (``try_start``'s with ``identity``).

    Per job the claim is the same guarded change as ``try_start``: Queued, no cancel
    requested, due, attempts left -> Running with attempt n+1 and its Running
    attempt row; both or neither. On PostgreSQL, ``SKIP LOCKED`` lets many workers
    claim from one queue without waiting for each other.

    The two parts keep their own guards and outcomes; sharing the commit only means
    that either both take effect or neither does. On PostgreSQL they are one
    statement, run in autocommit when the caller has no transaction open — unless
    ``limits`` apply: then the claim locks, counts and picks first, in the
    same transaction (:mod:`jobs.store.limits`).
    """
    batch = completions(completed)
    validation.integer(limit, "limit", 0, 10_000)
    if not limit:
        return complete_many(completed, now=now), []
    sequences = sorted(
        {
            (claim.scope_hash, claim.sequence_key)
            for claim, _result in completed
            if claim.sequence_key
        }
    )
    if sequences and limits and connection_for(Job).get_autocommit():
        # The next job of a sequence is released after the finish locked its row, in
        # the same transaction (see jobs.store.endings).
        with transaction.atomic(using=alias_for(Job)):
            return complete_and_claim(
                completed,
                worker_id,
                limit=limit,
                queues=queues,
                lease_seconds=lease_seconds,
                identity=identity,
                limits=limits,
                now=now,
            )
    worker_id = validation.text(worker_id, "worker_id", validation.MAX_NAME_LENGTH)
    now = current_time(now)
    expires = now + timedelta(seconds=lease_seconds or jobs_settings().LEASE_SECONDS)
    alias = alias_for(Job)
    connection = connection_for(Job)
    queue_list = list(queues or [])
    claim_rows = functools.partial(
        _claim_rows,
        connection,
        worker_id,
        limit=limit,
        queue_list=queue_list,
        identity=identity,
        expires=expires,
        now=now,
    )
    limits = limits.for_queues(queue_list)
    if limits:
        # Before the transaction: on SQLite, BEGIN IMMEDIATE takes the write lock.
        fault_point("jobs.claim.limited", limited=len(limits.handlers) + len(limits.queues))
        if is_postgres(connection):
            finished, claims = _claim_limited_postgres(
                claim_rows, connection, alias, limits, limit, batch
            )
            return outcomes(batch, finished), claims
        with transaction.atomic(using=alias):
            finished = finish_batch(connection, batch, now) if batch else {}
            claims = _claim_limited_sqlite(
                claim_rows, connection, limits, limit, queue_list, identity, now
            )
        return outcomes(batch, finished), claims
    if is_postgres(connection):
        # One statement finishes and claims; it is atomic by itself, so in autocommit
        # it is its own transaction: one round trip.
        if connection.get_autocommit():
            finished, claims, _ = claim_rows(finishing=batch, release=sequences)
        else:
            with transaction.atomic(using=alias):
                finished, claims, _ = claim_rows(finishing=batch)
        return outcomes(batch, finished), claims
    # SQLite has no data-modifying CTEs: the finishing statements come first.
    with transaction.atomic(using=alias):
        finished = finish_batch(connection, batch, now) if batch else {}
        _, claims, _ = claim_rows()
    return outcomes(batch, finished), claims
