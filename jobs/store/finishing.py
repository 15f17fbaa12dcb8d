"""Finishing an attempt: Running -> Succeeded, Failed, Interrupted or Cancelled, and
the re-queue of automatic retries.

Every finish — :func:`finish` (complete, fail, interrupt, a recovery without
re-queue), :func:`complete_many`
and the finishing half of :func:`jobs.store.claiming.complete_and_claim` — goes through
:func:`finish_batch`, which applies the finishing rule of :mod:`jobs.store.sql` to a batch of
attempts: a single finish is a batch of one, with its guards and its re-queue.

:func:`put_back_unknown_handler` ends a claim without an attempt: the worker did
not know the job's handler. :func:`snooze` queues the job again for later, the
execution recorded Snoozed and not counted as an attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F

from ledon.db import UNFLUSHED_COMMIT, adapt_dt, alias_for, connection_for, is_postgres

from .. import validation
from ..conf import jobs_settings
from ..db import asynchronous_commits, fetch
from ..exceptions import AttemptRowMissing, InvalidInput
from ..fair_share import place
from ..models import Job, JobAttempt
from ..types import AttemptStatus, Claim, FinishOutcome, JobStatus
from . import sql, sql_flow
from .base import CHUNK_ROWS, check_result_ref, check_token, current_time, notify, requeue_fields
from .endings import Moved, ending_params, follow, run_moving

#: How an attempt may end, and the job's status for it unless a cancel was requested.
_FINISH_STATUS = {
    AttemptStatus.SUCCEEDED: JobStatus.SUCCEEDED,
    AttemptStatus.FAILED: JobStatus.FAILED,
    AttemptStatus.INTERRUPTED: JobStatus.INTERRUPTED,
}


@dataclass(frozen=True, slots=True)
class Finishing:
    """One attempt to finish: its token, how it ended, its result or error (checked)."""

    token: str
    outcome: AttemptStatus
    result_ref: str | None = None
    error: str = ""

    def done_row(self) -> dict[str, Any]:
        """The batch row of :data:`sql.FINISHING`; only a success keeps its result."""
        succeeded = self.outcome is AttemptStatus.SUCCEEDED
        return {
            "token": self.token,
            "outcome": _FINISH_STATUS[self.outcome].value,
            "result_ref": self.result_ref if succeeded else None,
            "error": self.error,
            "summary": validation.job_error_summary(self.error),
        }


@dataclass(frozen=True, slots=True)
class Finished:
    """A finished attempt's job: its primary key, final status (Queued if the finish
    re-queued it) and queue, and what its batch and sequence need."""

    job_pk: int
    status: JobStatus
    queue: str
    scope_hash: str = ""
    job_id: str = ""
    handler: str = ""
    batch_id: str | None = None
    sequence_key: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Finished:
        """From a row of a finishing statement (:class:`sql.FinishedRow`'s columns)."""
        return cls(
            job_pk=cast(int, row["id"]),
            status=JobStatus(cast(str, row["status"])),
            queue=cast(str, row["queue"]),
            scope_hash=row["scope_hash"],
            job_id=row["job_id"],
            handler=row["handler"],
            batch_id=row["batch_id"],
            sequence_key=row["sequence_key"],
        )

    def moved(self) -> Moved:
        """The job as moved from Running (see :mod:`jobs.store.endings`)."""
        return Moved(
            id=self.job_pk,
            scope_hash=self.scope_hash,
            job_id=self.job_id,
            handler=self.handler,
            queue=self.queue,
            was=JobStatus.RUNNING.value,
            status=self.status.value,
            batch_id=self.batch_id,
            sequence_key=self.sequence_key,
        )


def in_sequences(pairs: Sequence[tuple[Claim, str | None]]) -> bool:
    """Whether a job of ``pairs`` is in a sequence: its finish releases the next one in
    a statement after it, in the same transaction (see :mod:`jobs.store.endings`)."""
    return any(claim.sequence_key is not None for claim, _result in pairs)


def completions(pairs: Sequence[tuple[Claim, str | None]]) -> list[Finishing]:
    """``(claim, result_ref)`` pairs as successful finishes, results checked."""
    return [
        Finishing(claim.token, AttemptStatus.SUCCEEDED, check_result_ref(result))
        for claim, result in pairs
    ]


def finishing_params(
    connection: BaseDatabaseWrapper,
    batch: Sequence[Finishing],
    now: datetime,
    *,
    requeue: bool = False,
) -> dict[str, Any]:
    """The parameters of the finishing statements for ``batch``, but for their guards':
    with what follows in batches and sequences (``requeue``: a job the finish re-queues
    moves nothing there)."""
    params = sql.finishing_params(connection.vendor, [item.done_row() for item in batch])
    params.update(ending_params(connection, now), requeue=requeue)
    return params


def read_finished(rows: Sequence[sql.FinishedRow]) -> dict[str, Finished]:
    """The finished attempts, by token, among the rows of a PostgreSQL finishing statement.

    An ``'orphan'`` row means a job Running under its token has no Running attempt
    row; the statement then changed nothing, and the whole transition fails with
    ``AttemptRowMissing``.
    """
    finished = {}
    for row in rows:
        if row["kind"] == "orphan" or (row["kind"] == "finished" and not row["attempt_finished"]):
            raise AttemptRowMissing()
        if row["kind"] == "finished":
            finished[row["token"]] = Finished.from_row(row)
    return finished


def finish_batch(
    connection: BaseDatabaseWrapper,
    batch: Sequence[Finishing],
    now: datetime,
    *,
    lease_expired_before: datetime | None = None,
    leased_by: str | None = None,
    requeue_at: datetime | None = None,
    error: str = "",
) -> dict[str, Finished]:
    """The finishing rule for every attempt of ``batch``, in the caller's transaction (or, on
    PostgreSQL in autocommit, as one statement that is its own transaction), with what
    follows in the finished jobs' batches and sequences (:mod:`jobs.store.endings`).

    With ``requeue_at`` (a batch of one), a job that ends Failed or Interrupted with
    attempts left and no cancel request is queued again for then in the same
    transaction (its status Queued in the result), its ``error`` summed up.

    Returns the attempts that finished, by token; a token missing from the result was
    not current (stale) and changed nothing. A job Running under a token of the batch
    without its Running attempt row raises ``AttemptRowMissing``: nothing changed, or
    the caller's transaction must be rolled back (every caller here runs this inside
    ``transaction.atomic`` unless it is the single PostgreSQL statement).
    """
    unique: dict[str, Finishing] = {}
    for item in batch:  # a token given twice is finished once, as first given
        unique.setdefault(item.token, item)
    batch = list(unique.values())
    guards = {"lease_guard": lease_expired_before is not None, "owner_guard": leased_by is not None}
    guard_params: dict[str, Any] = {}
    if lease_expired_before is not None:
        guard_params["lease_expired_before"] = adapt_dt(connection, lease_expired_before)
    if leased_by is not None:
        guard_params["leased_by"] = leased_by

    requeue = requeue_at is not None

    def params(chunk: Sequence[Finishing]) -> dict[str, Any]:
        return {**finishing_params(connection, chunk, now, requeue=requeue), **guard_params}

    if is_postgres(connection):
        rows = fetch(connection, sql.finish(**guards), params(batch), prepare=True)
        finished = read_finished(cast(list[sql.FinishedRow], rows))
    else:
        finished = _finish_sqlite(connection, batch, params, guards)
    if requeue_at is not None:
        finished = {
            token: _requeued(connection, job, requeue_at, now, error)
            for token, job in finished.items()
        }
    follow(
        connection, [job.moved() for job in finished.values()], now, counted=is_postgres(connection)
    )
    return finished


def _requeued(
    connection: BaseDatabaseWrapper, job: Finished, run_at: datetime, now: datetime, error: str
) -> Finished:
    """``job`` queued again at ``run_at`` if it ended as a finish re-queues (the guard of
    :func:`sql.requeued`); as it is otherwise."""
    if job.status not in sql.REQUEUED_ENDINGS:
        return job
    requeued = Job.objects.filter(
        pk=job.job_pk,
        status=job.status,
        cancel_requested=False,
        attempt_count__lt=F("max_attempts"),
    ).update(**{**requeue_fields(run_at, now), "error": validation.job_error_summary(error)})
    if not requeued:
        return job
    if run_at <= now:
        notify(connection, job.queue)
    return replace(job, status=JobStatus.QUEUED)


def _finish_sqlite(
    connection: BaseDatabaseWrapper,
    batch: Sequence[Finishing],
    params: Callable[[Sequence[Finishing]], dict[str, Any]],
    guards: dict[str, bool],
) -> dict[str, Finished]:
    """SQLite: the finishing rule, two statements per chunk of the batch."""
    finished: dict[str, Finished] = {}
    for start in range(0, len(batch), CHUNK_ROWS):
        chunk = batch[start : start + CHUNK_ROWS]
        values = params(chunk)
        attempts = fetch(connection, sql.finish_attempts_sqlite(len(chunk), **guards), values)
        jobs = fetch(connection, sql.finish_jobs_sqlite(len(chunk), **guards), values)
        tokens = {row["job_pk"]: row["token"] for row in attempts}
        if len(tokens) != len(attempts) or tokens.keys() != {row["id"] for row in jobs}:
            raise AttemptRowMissing()
        for row in jobs:
            finished[tokens[row["id"]]] = Finished.from_row(row)
    return finished


def outcomes(batch: Sequence[Finishing], finished: dict[str, Finished]) -> dict[str, FinishOutcome]:
    """Each token's outcome: its job's final status, or STALE if it did not finish."""
    return {
        item.token: FinishOutcome(finished[item.token].status.value)
        if item.token in finished
        else FinishOutcome.STALE
        for item in batch
    }


def finish(
    token: str,
    outcome: AttemptStatus,
    *,
    result_ref: str | None = None,
    error: str = "",
    requeue_at: datetime | None = None,
    lease_expired_before: datetime | None = None,
    leased_by: str | None = None,
    now: datetime | None = None,
) -> FinishOutcome:
    """End the current attempt of a Running job, both rows in one transaction.

    The database decides cancel-versus-finish: if a cancel request committed first,
    the job ends Cancelled and any result reference is dropped. With ``requeue_at``,
    a Failed job with attempts left and no cancel request is queued again in the same
    transaction (automatic retry; an interrupted one is recovered instead, under the
    crash budget: :func:`jobs.store.recovering.recover`). ``lease_expired_before`` and
    ``leased_by`` narrow the guard so that a recovery without re-queue
    (:func:`jobs.store.recovering.recover`) never robs a live worker.
    A stale token changes nothing and returns ``FinishOutcome.STALE``.
    """
    token = check_token(token)
    if outcome not in _FINISH_STATUS:
        raise InvalidInput(f"an attempt cannot finish as {outcome!r}")
    result_ref = check_result_ref(result_ref)
    error = validation.text(error, "error", validation.MAX_TEXT_LENGTH)
    now = current_time(now)
    connection = connection_for(Job)
    with transaction.atomic(using=alias_for(Job)):
        finished = finish_batch(
            connection,
            [Finishing(token, outcome, result_ref, error)],
            now,
            lease_expired_before=lease_expired_before,
            leased_by=leased_by,
            requeue_at=requeue_at,
            error=error,
        ).get(token)
    if finished is None:
        return FinishOutcome.STALE
    if finished.status is JobStatus.QUEUED:
        return FinishOutcome.REQUEUED
    return FinishOutcome(finished.status.value)


def give_back(connection: BaseDatabaseWrapper, limit_keys: str | None) -> None:
    """A job that counted in ``limit_keys`` (its column, as a statement that left
    Running returned it) gives its counts back, in the caller's transaction. Finishing
    statements do this themselves; a snooze and a put-back call this."""
    if limit_keys is not None:
        fetch(connection, sql.GIVE_BACK, {"limit_keys": limit_keys})


def put_back_unknown_handler(
    token: str, reason: str, *, now: datetime | None = None
) -> FinishOutcome:
    """The worker holding ``token`` does not know the job's handler or version.

    One guarded statement (token current, job Running) undoes the claim — the
    attempt count goes back down and the attempt row is deleted, so the claim never
    counts as an attempt — and, decided in the database: a cancel request that
    committed first ends the job Cancelled; else, while fewer than
    ``UNKNOWN_HANDLER_RETRY_SECONDS`` have passed since the job's first such claim
    (``handler_unknown_since``, set by the first), the job is Queued again
    ``UNKNOWN_HANDLER_RETRY_DELAY`` seconds later (``PUT_BACK``); after that it
    ends Failed with ``reason`` (which names the handler and version). A stale token
    changes nothing (``STALE``); a missing attempt row fails the whole transition.
    """
    token = check_token(token)
    reason = validation.text(reason, "reason", validation.MAX_TEXT_LENGTH - 200)
    now = current_time(now)
    settings = jobs_settings()
    window = settings.UNKNOWN_HANDLER_RETRY_SECONDS
    run_at = now + timedelta(seconds=min(settings.UNKNOWN_HANDLER_RETRY_DELAY, window))
    connection = connection_for(Job)
    params = {
        "token": token,
        "window_start": adapt_dt(connection, now - timedelta(seconds=window)),
        "run_at": adapt_dt(connection, run_at),
        "run_at_place": place(run_at),
        "waiting": (
            f"{reason} (put back until a worker that knows it claims it, for at most "
            f"{window:g} s since its first claim: JOBS['UNKNOWN_HANDLER_RETRY_SECONDS'])"
        ),
        "failed": (
            f"{reason} (no worker knew it within {window:g} s of its first claim: "
            "JOBS['UNKNOWN_HANDLER_RETRY_SECONDS'])"
        ),
    }
    with transaction.atomic(using=alias_for(Job)):
        # Failed or Cancelled is final: what follows in its batch and sequence too.
        rows = run_moving(
            connection, sql_flow.PUT_BACK_UNKNOWN_HANDLER, params, now, was=JobStatus.RUNNING.value
        )
        if not rows:
            return FinishOutcome.STALE
        give_back(connection, rows[0]["limit_keys"])
        deleted, _ = JobAttempt.objects.filter(token=token, status=AttemptStatus.RUNNING).delete()
        if not deleted:
            raise AttemptRowMissing()
    final = JobStatus(rows[0]["status"])
    return FinishOutcome.PUT_BACK if final is JobStatus.QUEUED else FinishOutcome(final.value)


def complete_many(
    completed: Sequence[tuple[Claim, str | None]], *, now: datetime | None = None
) -> dict[str, FinishOutcome]:
    """``complete`` for several attempts in one transaction: ``(claim, result_ref)``
    pairs in, each token's outcome out.

    Every attempt is finished exactly as :func:`finish` would finish it alone — only
    if its token is current and its job Running; Cancelled, result dropped, if a cancel
    request committed first; its attempt row in the same transaction — but the batch
    shares one commit. A stale token is ``STALE`` and changes nothing; a missing
    attempt row fails the whole batch (``AttemptRowMissing``), which changes nothing.
    On PostgreSQL the batch is one statement, run in autocommit when the caller has no
    transaction open.
    """
    batch = completions(completed)
    if not batch:
        return {}
    given, now = now, current_time(now)
    connection = connection_for(Job)
    if is_postgres(connection) and connection.get_autocommit() and not in_sequences(completed):
        return outcomes(batch, finish_batch(connection, batch, now))
    with transaction.atomic(using=alias_for(Job)):
        # On SQLite, timed once BEGIN IMMEDIATE holds the write lock (as the claims).
        now = now if is_postgres(connection) else current_time(given)
        return outcomes(batch, finish_batch(connection, batch, now))


#: The most snoozes a ``max_snoozes`` can allow.
MAX_SNOOZES_LIMIT = 1_000_000


def snooze(
    token: str,
    run_at: datetime,
    *,
    max_snoozes: int = MAX_SNOOZES_LIMIT,
    now: datetime | None = None,
) -> FinishOutcome:
    """The handler holding ``token`` raised ``Snooze``: in one transaction the job
    is Queued again at ``run_at`` — the execution taken back from ``attempt_count``
    (it never counts against ``max_attempts``) and counted in ``snooze_count`` — and
    its attempt row ends Snoozed (``SNOOZED``). A job that snoozed ``max_snoozes``
    times already ends Failed instead, its error naming the bound (``FAILED``). A
    cancel request that committed first ends the job Cancelled instead, as a finish
    would; a stale token changes nothing (``STALE``); a missing attempt row fails the
    whole transition."""
    token = check_token(token)
    now = current_time(now)
    run_at = validation.aware_utc(run_at, "run_at")
    max_snoozes = validation.integer(max_snoozes, "max_snoozes", 0, MAX_SNOOZES_LIMIT)
    connection = connection_for(Job)
    params = {
        "token": token,
        "now": adapt_dt(connection, now),
        "run_at": adapt_dt(connection, run_at),
        "run_at_place": place(run_at),
        "note": f"snoozed until {run_at.isoformat()}",
        "max_snoozes": max_snoozes,
    }
    with transaction.atomic(using=alias_for(Job)):
        rows = fetch(connection, sql_flow.SNOOZE_JOB, params)
        if not rows:
            refused = fetch(connection, sql_flow.SNOOZE_REFUSED, {"token": token})
            if not refused:
                return FinishOutcome.STALE
            job = refused[0]
            # A cancel request committed first: the finishing rule decides (Cancelled).
            ending = Finishing(token, AttemptStatus.SUCCEEDED)
            if not job["cancel_requested"]:
                ending = Finishing(
                    token,
                    AttemptStatus.FAILED,
                    error=(
                        f"handler {job['handler']!r} snoozed {job['snooze_count']} times, "
                        f"the most its max_snoozes={max_snoozes} allows; it asked to run "
                        f"again at {run_at.isoformat()}"
                    ),
                )
            finished = finish_batch(connection, [ending], now).get(token)
            return FinishOutcome.STALE if finished is None else FinishOutcome(finished.status.value)
        job = rows[0]
        if not fetch(connection, sql_flow.SNOOZE_ATTEMPT, {**params, "job": job["id"]}):
            raise AttemptRowMissing()
        give_back(connection, job["limit_keys"])
        if run_at <= now:
            notify(connection, job["queue"])
    return FinishOutcome.SNOOZED


@contextmanager
def asynchronous_commit(enabled: bool, *, one_statement: bool = False) -> Iterator[None]:
    """With ``enabled`` on PostgreSQL: what runs inside commits without waiting for
    its WAL to reach the disk (``synchronous_commit = off`` for that transaction
    only), for the worker's own claims and finishes (``JOBS["ASYNCHRONOUS_COMMIT"]``).
    Otherwise nothing: what runs inside commits as it would anyway.

    With ``one_statement`` — the caller runs one statement that opens no transaction
    of its own (the finish-and-claim without limits), in autocommit — the setting
    goes in one pipeline with the statement (:func:`jobs.db.asynchronous_commits`):
    still one round trip. Otherwise one transaction that starts with
    ``synchronous_commit = off`` for the transaction (:data:`ledon.db.UNFLUSHED_COMMIT`)."""
    connection = connection_for(Job)
    if not enabled or not is_postgres(connection):
        yield
        return
    if one_statement and connection.get_autocommit():
        with asynchronous_commits():
            yield
        return
    with transaction.atomic(using=alias_for(Job)):
        with connection.cursor() as cursor:
            cursor.execute(UNFLUSHED_COMMIT)
        yield
