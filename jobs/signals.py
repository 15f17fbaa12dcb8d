"""Signals of the jobs app.

``jobs_enqueued``, ``attempt_finished``, ``queued_job_cancelled``,
``job_keeps_killing_worker``, ``jobs_expired`` and ``jobs_held_back`` say what happened
to jobs, for optional
layers such as the Prometheus metrics (:mod:`jobs.observability.metrics`) and for apps
built on jobs (``workflows`` ends an activity item whose job was cancelled).

``worker_started`` and ``worker_stopping`` are for apps that run beside the worker in
every ``run_jobs`` process (``sagas`` recovers unfinished saga instances
there); both are sent with ``sender=Worker`` and ``worker=<the Worker>``.

A receiver that raises is logged and does not stop the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import transaction
from django.dispatch import Signal

from ledon.errors import send_logged

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .store.limits import Held
    from .types import Claim, FinishOutcome

__all__ = [
    "attempt_finished",
    "cancelled_queued_job",
    "finished_attempt",
    "held_back",
    "job_keeps_killing_worker",
    "jobs_enqueued",
    "jobs_expired",
    "jobs_held_back",
    "kept_killing_worker",
    "queued_job_cancelled",
    "send_logged",
    "worker_started",
    "worker_stopping",
]

#: Jobs were created, sent with ``sender=Job``, ``snapshots`` (the new jobs),
#: ``staged`` (True: inside the caller's transaction, which may still roll back —
#: count them on commit) and ``using`` (the database alias).
jobs_enqueued = Signal()

#: An attempt ended and its end was recorded, sent by whoever ran it (the
#: worker, :func:`jobs.testing.run_jobs_inline`) with ``sender=Job``, ``claim``,
#: ``outcome`` (a :class:`~jobs.types.FinishOutcome`) and ``retry_scheduled`` (a
#: failed attempt whose job was queued again). Use :func:`finished_attempt`.
attempt_finished = Signal()


def finished_attempt(claim: Claim, outcome: FinishOutcome, *, retry_scheduled: bool) -> None:
    """Send :data:`attempt_finished` (receivers' errors are logged, never raised)."""
    if attempt_finished.receivers:
        from .models import Job  # the sender; signals is imported before the models

        send_logged(
            attempt_finished,
            Job,
            "attempt_finished",
            claim=claim,
            outcome=outcome,
            retry_scheduled=retry_scheduled,
        )


#: A Queued job was cancelled at once (no attempt ran it, so ``attempt_finished``
#: never comes), sent once that commits with ``sender=Job``, ``scope_hash`` and
#: ``job_id``. Use :func:`cancelled_queued_job`.
queued_job_cancelled = Signal()


def cancelled_queued_job(scope_hash: str, job_id: str, using: str) -> None:
    """Send :data:`queued_job_cancelled` when the caller's transaction on ``using``
    commits (receivers' errors are logged, never raised)."""
    if not queued_job_cancelled.receivers:
        return
    from .models import Job  # the sender; signals is imported before the models

    transaction.on_commit(
        lambda: send_logged(
            queued_job_cancelled,
            Job,
            "queued_job_cancelled",
            scope_hash=scope_hash,
            job_id=job_id,
        ),
        using=using,
    )


#: A job ended Interrupted as one that keeps killing its worker: the recovery of an
#: attempt whose worker died or outlived its shutdown's grace reached
#: ``JOBS["MAX_INTERRUPTIONS"]``. Sent once that commits, by the process that
#: recovered it, with ``sender=Job``, ``scope_hash``, ``job_id``, ``handler``,
#: ``queue`` and ``interruptions`` (the job's count). Use :func:`kept_killing_worker`.
job_keeps_killing_worker = Signal()


def kept_killing_worker(
    *, scope_hash: str, job_id: str, handler: str, queue: str, interruptions: int
) -> None:
    """Send :data:`job_keeps_killing_worker` (receivers' errors are logged, never
    raised); the caller sends it once the recovery committed."""
    if not job_keeps_killing_worker.receivers:
        return
    from .models import Job  # the sender; signals is imported before the models

    send_logged(
        job_keeps_killing_worker,
        Job,
        "job_keeps_killing_worker",
        scope_hash=scope_hash,
        job_id=job_id,
        handler=handler,
        queue=queue,
        interruptions=interruptions,
    )


#: Queued jobs ended Expired (their start deadline passed; no attempt ran them), sent
#: after the sweep committed with ``sender=None`` and ``jobs``, a list of each one's
#: (queue, handler).
jobs_expired = Signal()


#: A claim left due jobs Queued because a limit had no room for them — of the jobs a
#: claim without limits would have taken —, sent after the claim by the process that
#: made it, with ``sender=None`` and ``held``, a list of (queue, handler, rule,
#: count); ``rule`` names the limit and whose it is: ``handler.max_running``,
#: ``queue.rate_per_key`` and so on. Use :func:`held_back`.
jobs_held_back = Signal()


def held_back(held: Sequence[Held]) -> None:
    """Send :data:`jobs_held_back` (receivers' errors are logged, never raised)."""
    if jobs_held_back.receivers:
        send_logged(
            jobs_held_back,
            None,
            "jobs_held_back",
            held=[(item.queue, item.handler, item.rule, item.count) for item in held],
        )


#: A worker has started: its start-up recovery is done, it is about to claim jobs.
worker_started = Signal()

#: A worker is stopping: it claims nothing more (its running handlers may still be
#: finishing). Receivers stop what they started for it, so that nothing new is
#: enqueued or started during the shutdown; in ``burst`` mode (nothing was left) they
#: may first let it finish.
worker_stopping = Signal()
