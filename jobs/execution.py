"""The trusted executor side: cross-scope candidates and execution writes.

Only workers and operators' tools should import this module. Every write is fenced
by an attempt token minted at claim time: a late call carrying an old token changes
nothing and returns a falsy outcome.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import Count

from ledon.db import connection_for

from . import store, validation
from .conf import claim_limits as configured_claim_limits
from .conf import jobs_settings
from .flow_control import ClaimLimits
from .models import Job, RateBucket
from .schedules import service as schedules
from .signals import jobs_expired
from .store import rates as _rates
from .types import AttemptStatus, Claim, DueJob, ExecutionStatus, FinishOutcome, JobSnapshot

if TYPE_CHECKING:
    from .api import JobScope
    from .store.queues import QueueState
    from .store.shares import ScopeShare
    from .store.waiting import KeyState, Waiting

__all__ = [
    "Claim",
    "DueJob",
    "ExecutionStatus",
    "FinishOutcome",
    "claim_due",
    "claim_limits",
    "complete",
    "complete_and_claim",
    "complete_many",
    "default_worker_id",
    "due_counts_by_queue",
    "enqueue_due_schedules",
    "execution_statuses",
    "expire_jobs",
    "fail",
    "get_due",
    "get_execution_status",
    "heartbeat",
    "interrupt",
    "key_states",
    "pause_queue",
    "prune_rates",
    "put_back_unknown_handler",
    "queue_states",
    "recover",
    "recover_expired",
    "recover_worker",
    "release",
    "report_progress",
    "reserved_scope",
    "resume_queue",
    "scope_shares",
    "set_scope_weight",
    "snooze",
    "try_start",
    "why_waiting",
]


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def claim_limits() -> ClaimLimits:
    """The limits every claim of this process keeps — its handlers' and
    ``JOBS["QUEUES"]`` (falsy when there are none: claims are then one statement)."""
    return configured_claim_limits()


def get_due(
    limit: int = 100, queues: Sequence[str] | None = None, *, now: datetime | None = None
) -> list[DueJob]:
    """Due candidates (Queued, no cancel requested, due, attempts left), by priority
    then time. Grants nothing: start one with :func:`try_start`."""
    return store.get_due(limit=limit, queues=queues, now=now)


def due_counts_by_queue(*, now: datetime | None = None, paused: bool = True) -> dict[str, int]:
    """How many jobs are due now, per queue (for operators' hints and tools);
    ``paused=False`` leaves out the queues that are paused."""
    due = Job.objects.due(store.current_time(now))
    if not paused:
        due = due.unpaused()
    rows = due.values_list("queue").annotate(count=Count("id"))
    return dict(rows.order_by())


def try_start(
    scope_hash: str,
    job_id: str,
    worker_id: str | None = None,
    *,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> Claim | None:
    """Start one job if it is still claimable: new token, attempt n+1, Running attempt
    row — one transaction. None if another worker won or the job is no longer due."""
    identity = (validation.validate_scope_hash(scope_hash), validation.existing_job_id(job_id))
    _, claims = _claiming(
        (), worker_id, limit=1, identity=identity, lease_seconds=lease_seconds, now=now
    )
    return claims[0] if claims else None


def claim_due(
    worker_id: str | None = None,
    *,
    limit: int = 1,
    queues: Sequence[str] | None = None,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> list[Claim]:
    """Start up to ``limit`` due jobs in one transaction (PostgreSQL: SKIP LOCKED),
    keeping every limit and skipping paused queues."""
    validation.integer(limit, "limit", 1, 10_000)
    _, claims = _claiming(
        (), worker_id, limit=limit, queues=queues, lease_seconds=lease_seconds, now=now
    )
    return claims


def _claiming(
    completions: Sequence[tuple[Claim, str | None]], worker_id: str | None, **claim: Any
) -> tuple[dict[str, FinishOutcome], list[Claim]]:
    """The store's finish-and-claim as this process runs it: its default worker id,
    every limit of :func:`claim_limits` kept; ``claim``: the rest of its
    keywords."""
    return store.complete_and_claim(
        completions, worker_id or default_worker_id(), limits=claim_limits(), **claim
    )


def report_progress(
    token: str, value: float, message: str | None = None, *, now: datetime | None = None
) -> bool:
    """Record progress (a percentage); False, changing nothing, unless the token is
    current, no cancel is requested and the value does not go down."""
    return store.report_progress(token, value, message, now=now)


def complete(
    token: str, result_ref: str | None = None, *, now: datetime | None = None
) -> FinishOutcome:
    """Finish the attempt successfully (Cancelled, result dropped, if a cancel request
    committed first). ``FinishOutcome.STALE`` (falsy) if the token is not current."""
    return store.finish(token, AttemptStatus.SUCCEEDED, result_ref=result_ref, now=now)


def complete_many(
    completions: Sequence[tuple[Claim, str | None]], *, now: datetime | None = None
) -> dict[str, FinishOutcome]:
    """:func:`complete` for several attempts, ``(claim, result_ref)`` pairs, sharing one
    commit; each token's outcome is returned (``STALE`` for a token not current)."""
    return store.complete_many(completions, now=now)


def asynchronous_commit(
    enabled: bool, *, one_statement: bool = False
) -> AbstractContextManager[None]:
    """A worker's claim or finish run inside commits without waiting for its WAL
    flush when ``enabled`` on PostgreSQL (``JOBS["ASYNCHRONOUS_COMMIT"]``); otherwise
    as it would. ``one_statement``: what runs inside is one statement in autocommit
    (see :func:`jobs.store.finishing.asynchronous_commit`)."""
    return store.asynchronous_commit(enabled, one_statement=one_statement)


def complete_and_claim(
    completions: Sequence[tuple[Claim, str | None]],
    worker_id: str | None = None,
    *,
    limit: int,
    queues: Sequence[str] | None = None,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> tuple[dict[str, FinishOutcome], list[Claim]]:
    """:func:`complete_many` then :func:`claim_due` in one transaction: a worker's
    round trip when handlers return and capacity frees up (``limit`` may be 0)."""
    return _claiming(
        completions, worker_id, limit=limit, queues=queues, lease_seconds=lease_seconds, now=now
    )


def fail(
    token: str, error: str, *, retry_at: datetime | None = None, now: datetime | None = None
) -> FinishOutcome:
    """Finish the attempt as Failed with ``error``. With ``retry_at`` and attempts left,
    the job is queued again for that time in the same transaction (``REQUEUED``)."""
    requeue_at = validation.optional_aware_utc(retry_at, "retry_at")
    return store.finish(token, AttemptStatus.FAILED, error=error, requeue_at=requeue_at, now=now)


def interrupt(
    token: str, reason: str = "interrupted", *, now: datetime | None = None
) -> FinishOutcome:
    """End the attempt as Interrupted without re-queueing the job."""
    return store.finish(token, AttemptStatus.INTERRUPTED, error=reason, now=now)


def put_back_unknown_handler(
    token: str, reason: str, *, now: datetime | None = None
) -> FinishOutcome:
    """This worker does not know the claimed job's handler or version. The job
    goes back to Queued for later without consuming an attempt (``PUT_BACK``) until
    ``JOBS["UNKNOWN_HANDLER_RETRY_SECONDS"]`` have passed since its first such claim,
    then ends Failed with ``reason``; Cancelled if its cancel was requested."""
    return store.put_back_unknown_handler(token, reason, now=now)


def release(
    token: str, reason: str = "released by the worker's shutdown", *, now: datetime | None = None
) -> FinishOutcome:
    """Give a claim back unused (the worker's graceful shutdown stopped its handler,
    or it never started): the job is Queued again, its attempt count restored, and
    the attempt row ends Released with ``reason`` (``RELEASED``). Cancelled if its
    cancel was requested first; ``STALE`` (nothing changed) if ``token`` is not
    current."""
    from .store.releasing import release as release_claim  # a worker's shutdown only

    return release_claim(token, reason, now=now)


def snooze(
    token: str,
    run_at: datetime,
    *,
    max_snoozes: int | None = None,
    now: datetime | None = None,
) -> FinishOutcome:
    """The handler raised ``Snooze``: the job is Queued again at ``run_at`` and the
    execution, recorded Snoozed, does not count against ``max_attempts``
    (``SNOOZED``); Cancelled if its cancel was requested first. A job that snoozed
    ``max_snoozes`` times already (default ``JOBS["MAX_SNOOZES"]``; the handler's
    own with ``@job_handler(max_snoozes=…)``) ends Failed naming the bound."""
    if max_snoozes is None:
        max_snoozes = jobs_settings().MAX_SNOOZES
    return store.snooze(token, run_at, max_snoozes=max_snoozes, now=now)


def pause_queue(name: str, *, now: datetime | None = None) -> bool:
    """Pause queue ``name`` for every worker: no claim takes its jobs until
    :func:`resume_queue` (attempts already running go on). Persisted; True if it was
    not paused already."""
    return store.pause(name, now=now)


def resume_queue(name: str, *, now: datetime | None = None) -> bool:
    """Resume queue ``name`` (and wake the workers); True if it was paused."""
    return store.resume(name, now=now)


def expire_jobs(*, limit: int = 1000, now: datetime | None = None) -> int:
    """End Expired up to ``limit`` Queued jobs whose start deadline passed (no claim
    takes them meanwhile: the deadline is in the claim's guard); returns how many.
    Every ``run_jobs`` worker calls it as it recovers expired leases."""
    expired = store.expire_due(limit=limit, now=now)
    if expired:
        jobs_expired.send(sender=None, jobs=expired)
    return len(expired)


def set_scope_weight(scope: str | JobScope, weight: float) -> float:
    """Give ``scope`` (a scope string, or a :class:`JobScope` such as
    :func:`reserved_scope`'s) ``weight`` times the default share of every fair queue's
    starts: a number in (0, 100], 1 by default, persisted. Jobs submitted from now on
    take their places in line by it; returns the weight the scope had. Raises
    ``InvalidWeight`` (writing nothing) for a weight out of range, ``InvalidScope``
    for a bad scope."""
    from .api import JobScope  # the scoped API's, loaded by those who use it

    scope_hash = scope.scope_hash if isinstance(scope, JobScope) else validation.scope_hash(scope)
    return store.set_weight(scope_hash, weight)


def scope_shares(queue: str | None = None) -> list[ScopeShare]:
    """Per queue (or only ``queue``) and scope with Queued or Running jobs: its weight
    and its jobs, most Queued first."""
    return store.scope_shares(queue)


def queue_states(names: Sequence[str] | None = None) -> list[QueueState]:
    """Every known queue's depth, Running jobs and pause, by name (``names`` are
    listed even when empty)."""
    return store.queue_states(list(names or []))


def why_waiting(scope_hash: str, job_id: str, *, now: datetime | None = None) -> Waiting:
    """Why job ``job_id`` of scope ``scope_hash`` has not started at ``now``: its
    reasons as data (its start deadline passed, its queue paused, not due until when
    and why, each limit of this process's claims with no room for it, with its count
    or when its rate frees; else its place in line), none if it is not Queued.
    ``describe()`` renders them. Raises ``JobNotFound``."""
    identity = validation.validate_scope_hash(scope_hash), validation.existing_job_id(job_id)
    return store.why_waiting(*identity, now=now)


def key_states(queue: str | None = None, *, now: datetime | None = None) -> list[KeyState]:
    """Each limit of this process's claims with Queued or Running jobs — with
    ``queue``, those its jobs fall under —, as a whole and per limit key: its jobs,
    its cap, its rate's free units and when the next one frees."""
    if queue is not None:
        queue = validation.name(queue, "queue", validation.MAX_QUEUE_LENGTH)
    return store.key_states(queue, now=now)


def prune_rates(*, now: datetime | None = None) -> int:
    """Delete the rows of rates (``jobs_ratebucket``) that have held nothing for five
    minutes — a full bucket, an empty window, the same as no row; returns how many."""
    return _rates.prune(connection_for(RateBucket), store.current_time(now))


def recover(
    token: str,
    requeue: bool = True,
    *,
    reason: str = "recovered: the attempt's worker stopped",
    now: datetime | None = None,
) -> FinishOutcome:
    """End an old attempt (its worker died, or outlived its shutdown's grace) as
    Interrupted and, if ``requeue`` and no cancel was requested, queue the job again at
    once without using an attempt (``REQUEUED``) — one transaction — while its
    interruptions stay below ``JOBS["MAX_INTERRUPTIONS"]``; the one that reaches it
    ends the job Interrupted as one that keeps killing its worker
    (``KEEPS_KILLING_WORKER``). Without ``requeue``: as :func:`interrupt`."""
    return store.recover(token, requeue=requeue, reason=reason, now=now)


def get_execution_status(token: str) -> ExecutionStatus:
    """ACTIVE, CANCEL_REQUESTED or ENDED (stale, unknown or finished token: stop)."""
    return store.execution_statuses([token])[token]


def execution_statuses(tokens: Sequence[str]) -> dict[str, ExecutionStatus]:
    """:func:`get_execution_status` for several tokens, in one read."""
    return store.execution_statuses(tokens)


#: Renew the leases of this worker's attempts and report each token's status: the
#: store's transition as it is (nothing to add on the executor's side).
heartbeat = store.heartbeat


def recover_expired(
    *, requeue: bool = True, limit: int = 100, now: datetime | None = None
) -> dict[str, FinishOutcome]:
    """Recover every Running attempt whose lease expired (its worker is gone), each
    as :func:`recover` does (the crash budget).

    Each recovery re-checks the expiry in its guard, so an attempt whose worker
    renewed the lease in the meantime is left alone.
    """
    when = store.current_time(now)
    return {
        token: store.recover(
            token,
            requeue=requeue,
            reason="recovered: lease expired (worker stopped or lost)",
            lease_expired_before=when,
            now=when,
        )
        for token in store.expired_tokens(now=when, limit=limit)
    }


def recover_worker(
    worker_id: str,
    *,
    requeue: bool = True,
    keep: Collection[str] = (),
    reason: str | None = None,
    now: datetime | None = None,
) -> dict[str, FinishOutcome]:
    """Recover the Running attempts leased by ``worker_id`` — a restarted worker
    taking back its own attempts at once, without waiting for the lease to expire —
    but for the tokens in ``keep`` (attempts the worker still runs), each as
    :func:`recover` does (the crash budget)."""
    reason = reason or f"recovered: worker {worker_id} restarted"
    return {
        token: store.recover(token, requeue=requeue, reason=reason, leased_by=worker_id, now=now)
        for token in store.tokens_leased_by(worker_id)
        if token not in keep
    }


def reserved_scope(name: str) -> JobScope:
    """The reserved scope ``name``: where the library keeps its own jobs (schedules in
    ``JOBS["SCHEDULE_SCOPE"]``, the ``django.tasks`` backend in its ``OPTIONS["SCOPE"]``).

    It hashes in a namespace of its own, so ``JobScope(name)`` is the tenant ``name``
    and can never read, cancel or retry these jobs; trusted code (admin, commands,
    tests) reaches them through this. Raises ``InvalidScope`` for a bad name.
    """
    from .api import JobScope  # the scoped API's, loaded by those who use it

    return JobScope._reserved(name)


def purge_finished(*, older_than: datetime, limit: int = 1000) -> int:
    """Retention: delete up to ``limit`` jobs that finished before ``older_than``, with
    their attempts; returns how many (see :func:`jobs.store.purge_finished`)."""
    return store.purge_finished(older_than=older_than, limit=limit)


def enqueue_due_schedules(now: datetime | None = None) -> list[JobSnapshot]:
    """Enqueue the periods of this process's schedules (``@periodic``) that are due as
    of ``now`` (default: the current time) and return their jobs, oldest period
    first. Each period is one job of scope ``JOBS["SCHEDULE_SCOPE"]`` whose id
    names it, so concurrent calls — threads, processes, machines — create exactly one
    job per period. When nothing is due it costs one read and no write. Every
    ``run_jobs`` worker calls it at each period start (``JOBS["SCHEDULER"]``).
    """
    return schedules.enqueue_due_schedules(now)
