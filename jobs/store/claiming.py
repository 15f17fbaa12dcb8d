"""Claiming: Queued -> Running with a new token and its attempt row, alone or
after finishing a batch of attempts in the same transaction (see
:mod:`jobs.store.finishing`).

A claim no limit applies to is one statement (:func:`jobs.store.sql.claim`). A claim
under limits is, on PostgreSQL, one statement that also changes the limits' rows, made
again the exact way — under the binding names' locks, one statement in one round trip
— when a limit binds; on SQLite it reads the usage, picks and claims under the write
lock (see :mod:`jobs.store.limits`). Either skips paused queues in its guard. What
the limits held back is sent as :data:`jobs.signals.jobs_held_back`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
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
from ..signals import held_back
from ..types import Claim, FinishOutcome
from . import limits as limits_store
from . import sql, sql_endings, sql_limits
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
from .limits import Held, choose, claim_keys, claim_locked, read_usage
from .limits import Job as LimitedJob
from .rates import write_states


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
    locks: list[int] | None = None,
    commit: bool = False,
    limited: bool = False,
    release: Sequence[tuple[str, str]] = (),
) -> tuple[dict[str, Finished], list[Claim], list[dict[str, Any]]]:
    """Claim inside the caller's transaction (see :func:`complete_and_claim`); on
    PostgreSQL, first finish ``finishing`` in the same statement (the finishing rule of
    :func:`sql.finish`).

    With ``chosen``, claim those jobs (picked under limits, SQLite) instead of the
    first due. With ``limits`` (PostgreSQL), the claim under limits: without
    ``locks``, made optimistically (:func:`jobs.store.sql_limits.counted_claim`);
    with them (a list, perhaps empty), the exact claim after those advisory locks
    (:func:`jobs.store.limits.claim_locked`), ``commit`` ending its transaction in the
    same round trip. With ``limited`` (SQLite, under limits), the claimed jobs' rows
    come back too, with their limit key and cost. The third value: those rows, or the
    rows of kind ``'skipped'`` and ``'held'`` the exact claim returned.

    With ``release`` (PostgreSQL, a claim without limits in autocommit that finishes
    jobs of those sequences — scope hash, key —, all successes: none halts), the
    statement is its own transaction with the release of each sequence's next job
    after it (:data:`jobs.store.sql_endings.RELEASE`), in one round trip: ``BEGIN``,
    the statement, the release, ``COMMIT``."""
    if chosen is not None and not chosen:
        return {}, [], []
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
    extra: list[dict[str, Any]] = []
    if limits:
        keys, limit_params = claim_keys(limits, now)
        params.update(limit_params)
        shape = {"queues": len(queue_list), "one_job": identity is not None}
        if locks is None:
            statement = sql_limits.counted_claim(**shape, finishing=bool(finishing), keys=keys)
            rows = fetch(connection, statement, params, prepare=True)
        else:
            statement = sql_limits.limited_claim(**shape, finishing=bool(finishing), keys=keys)
            rows = claim_locked(connection, statement, params, locks=locks, commit=commit)
            extra = [row for row in rows if row["kind"] in ("skipped", "held")]
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
            limited=limited,
        )
        if release:
            params.update(release_params(release))
            statements = [statement, sql_endings.RELEASE, sql_limits.COMMIT]
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
    if limited:
        extra = rows
    return finished, claims, extra


ClaimRows = functools.partial[tuple[dict[str, Finished], list[Claim], list[dict[str, Any]]]]

#: The constraints a claim under limits fails on when it would go past a limit, and
#: whether each is a counter's (else a rate's).
_LIMIT_CONSTRAINTS = {
    sql.COUNTER_CAP: True,
    sql_limits.RATE_BURST: False,
    sql_limits.RATE_WINDOW: False,
}


def _bound_by(error: IntegrityError) -> bool | None:
    """Whether ``error`` is a limit's row taken past its limit — True: a counter's,
    False: a rate's —, or None: another error."""
    diag = getattr(error.__cause__, "diag", None)
    return _LIMIT_CONSTRAINTS.get(getattr(diag, "constraint_name", None) or "")


def _claim_counted(
    claim_rows: ClaimRows,
    connection: BaseDatabaseWrapper,
    alias: str,
    limits: ClaimLimits,
    finishing: Sequence[Finishing],
) -> tuple[dict[str, Finished], list[Claim]] | bool:
    """PostgreSQL: the claim under limits without locks or reads of usage — the plain
    claim's choice, counted (:func:`jobs.store.sql_limits.counted_claim`), one
    statement in autocommit (in the caller's transaction, behind a savepoint). If a
    limit binds, the statement failed on a row's constraint and changed nothing: then
    whether that row was a counter's (else a rate's)."""
    try:
        if connection.get_autocommit():
            finished, claims, _ = claim_rows(finishing=finishing, limits=limits)
        else:
            with transaction.atomic(using=alias):
                finished, claims, _ = claim_rows(finishing=finishing, limits=limits)
    except IntegrityError as error:
        counter = _bound_by(error)
        if counter is None:
            raise
        return counter
    return finished, claims


#: How many times an exact claim is made again when a claim that took no lock changed
#: one of its rows between its read and its change.
_LOCKED_TRIES = 5


def _claim_limited_postgres(
    claim_rows: ClaimRows,
    connection: BaseDatabaseWrapper,
    alias: str,
    limits: ClaimLimits,
    limit: int,
    finishing: Sequence[Finishing],
    rebind: Callable[[datetime], ClaimRows] | None = None,
) -> tuple[dict[str, Finished], list[Claim], list[Held]]:
    """PostgreSQL: the claim under limits of :mod:`jobs.store.limits` — optimistic
    first, unless the last claim of this process bound; then exact, under the locks
    of the binding names: one statement that finishes ``finishing``, reads the rooms,
    picks and claims, in one round trip with its transaction's BEGIN and COMMIT
    (inside the caller's transaction, without the COMMIT). Should a limit refuse a
    candidate while the claim is short, the claim goes on with the rest, in a
    transaction of its own, until it is full, no limit refuses one, or a claim takes
    none. Returns the finished attempts, the claims, and what the limits held back.

    With ``rebind`` (the claim at the current time, not one a caller gave), the exact
    claim takes its locks in a round trip of their own and is timed once it holds
    them: a wait for the locks must not age its clock — a window's row drops its
    starts an eighth of the window after they leave it, so a claim timed before a
    long wait would not count some that are still in its window, and its starts
    would read as made before those it followed."""
    binding = limits_store.binding.of(alias, limits)
    if binding:
        names = set(binding)
    else:
        counted = _claim_counted(claim_rows, connection, alias, limits, finishing)
        if not isinstance(counted, bool):
            return (*counted, [])
        names = set(limits_store.names_of_kind(limits, counted=counted, rated=not counted))
    finished: dict[str, Finished] = {}
    claims: list[Claim] = []
    held: list[Held] | None = None
    tries = 0
    while len(claims) < limit:
        commit = connection.get_autocommit()
        try:
            with transaction.atomic(using=alias):
                rows, locks = claim_rows, limits_store.lock_ids(names)
                if locks and rebind is not None:
                    fetch(connection, sql_limits.LOCK_KEYS, {"keys": locks})
                    rows, locks = rebind(current_time(None)), []
                page_finished, page, extra = rows(
                    limit=limit - len(claims),
                    finishing=finishing,
                    limits=limits,
                    locks=locks,
                    commit=commit,
                )
        except IntegrityError as error:
            counter = _bound_by(error)
            if counter is None:
                raise
            tries += 1
            if tries >= _LOCKED_TRIES:
                # Claims without locks kept changing the rows: claim nothing this time.
                if finishing:
                    finished = finish_alone(connection, alias, finishing)
                break
            names.update(limits_store.names_of_kind(limits, counted=counter, rated=not counter))
            continue
        finished = finished or page_finished
        finishing = ()
        claims.extend(page)
        if held is None:
            # The first page's: what held back the first due jobs.
            held = limits_store.held_of(extra)
            limits_store.binding.bound(alias, limits, (item.name for item in held))
        if not any(row["kind"] == "skipped" for row in extra) or not page:
            break
    return finished, claims, held or []


def finish_alone(
    connection: BaseDatabaseWrapper, alias: str, batch: Sequence[Finishing]
) -> dict[str, Finished]:
    """PostgreSQL: finish ``batch`` in a transaction of its own, claiming nothing."""
    with transaction.atomic(using=alias):
        return finish_batch(connection, batch, current_time(None))


#: What the limits of a claimed job are keyed by, as a claim under limits returns it.
_JOB_FIELDS = ("id", "handler", "queue", "scope_hash", "limit_key", "cost")


def _claim_limited_sqlite(
    claim_rows: ClaimRows,
    connection: BaseDatabaseWrapper,
    limits: ClaimLimits,
    limit: int,
    queue_list: list[str],
    identity: tuple[str, str] | None,
    now: datetime,
) -> tuple[list[Claim], list[Held]]:
    """SQLite, inside the caller's IMMEDIATE transaction: count, pick, claim,
    and write the rate rows back (see :mod:`jobs.store.limits`)."""
    usage = read_usage(connection, limits, now)
    if usage.room_for(limit):
        # No limit can be reached by `limit` more starts: the plain claim's choice.
        _, claims, rows = claim_rows(limited=True)
        for row in rows:
            usage.take(LimitedJob(**{name: row[name] for name in _JOB_FIELDS}))
        write_states(connection, usage.rates.values(), usage.now)
        return claims, []
    base: dict[str, Any] = {"now": adapt_dt(connection, now), **in_list_params("queue", queue_list)}
    if identity is not None:
        base["scope_hash"], base["job_id"] = identity
    chosen, held = choose(
        connection,
        usage,
        limit=limit,
        base_params=base,
        queues=len(queue_list),
        one_job=identity is not None,
    )
    _, claims, _rows = claim_rows(chosen=chosen, limited=True)
    write_states(connection, usage.rates.values(), usage.now)
    return claims, held


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
    statement, run in autocommit when the caller has no transaction open — with
    ``limits`` too, while none binds; one that binds makes the claim lock, read and
    pick first, in the same transaction (:mod:`jobs.store.limits`).
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
    given, now = now, current_time(now)
    alias = alias_for(Job)
    connection = connection_for(Job)
    queue_list = list(queues or [])

    def bind(now: datetime) -> ClaimRows:
        expires = now + timedelta(seconds=lease_seconds or jobs_settings().LEASE_SECONDS)
        return functools.partial(
            _claim_rows,
            connection,
            worker_id,
            limit=limit,
            queue_list=queue_list,
            identity=identity,
            expires=expires,
            now=now,
        )

    claim_rows = bind(now)
    limits = limits.for_queues(queue_list)
    if limits:
        # Before the transaction: on SQLite, BEGIN IMMEDIATE takes the write lock.
        fault_point("jobs.claim.limited", limited=len(limits.handlers) + len(limits.queues))
        if is_postgres(connection):
            finished, claims, held = _claim_limited_postgres(
                claim_rows, connection, alias, limits, limit, batch, bind if given is None else None
            )
        else:
            with transaction.atomic(using=alias):
                now = current_time(given)  # under the write lock, see below
                finished = finish_batch(connection, batch, now) if batch else {}
                claims, held = _claim_limited_sqlite(
                    bind(now), connection, limits, limit, queue_list, identity, now
                )
        if held:
            held_back(held)
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
        # BEGIN IMMEDIATE may have waited for another writer: the finishes and starts
        # are timed once the write lock is held, so that a job its finish released is
        # never recorded as started before that finish.
        now = current_time(given)
        finished = finish_batch(connection, batch, now) if batch else {}
        _, claims, _ = bind(now)()
    return outcomes(batch, finished), claims
