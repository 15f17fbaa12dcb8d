"""Every state transition of jobs and their attempts.

Each transition is one guarded statement — it succeeds only from the states that
allow it — inside ``transaction.atomic``, and returns a typed outcome or raises a
typed error. Nothing else in the app writes to ``jobs_job`` or ``jobs_jobattempt``.

    submit / stage ............ (new) -> QUEUED                      submission
    cancel .................... QUEUED -> CANCELLED                  scoped
                                RUNNING -> RUNNING + cancel flag     scoped
    cancel_queued ............. QUEUED -> CANCELLED, by id prefix    scoped
    cancel_running ............ RUNNING -> cancel flag, by id prefix  scoped
    claim / try_start ......... QUEUED -> RUNNING (new token, n+1)   claiming
    complete .................. RUNNING -> SUCCEEDED | CANCELLED     finishing
    fail ...................... RUNNING -> FAILED | CANCELLED        finishing
                                (with retry_at: -> QUEUED)           finishing + requeue
    interrupt ................. RUNNING -> INTERRUPTED | CANCELLED   finishing
    unknown handler ........... RUNNING -> QUEUED later | FAILED | CANCELLED,
                                the claim uncounted                  finishing
    snooze .................... RUNNING -> QUEUED later, uncounted   finishing
    release ................... RUNNING -> QUEUED, uncounted         releasing
    recover ................... RUNNING -> QUEUED, uncounted,        recovering
                                within the crash budget;
                                -> INTERRUPTED, keeps killing its
                                worker, at the budget | CANCELLED
                                (requeue=False: as interrupt)
    retry ..................... FAILED | CANCELLED | INTERRUPTED -> QUEUED   scoped
    purge_finished ............ finished, older than a cutoff -> (deleted)   retention
    pause / resume ............ a queue's claims stop / go on         queues
    set_weight ................ a scope's share of fair queues        shares
    expire_due ................ QUEUED past its start deadline -> EXPIRED   expiry
    submit_batch / stage_batch  (new batch) -> its jobs QUEUED          batches

Every move into, out of or between final states also moves the job's batch and
sequence, in the same transaction: :mod:`.endings`.

Why a Queued job waits, and each limit key's state, are reads in :mod:`.waiting`.

Claims under limits are in :mod:`.limits`.

Progress, heartbeats and execution status live in :mod:`.progress`, reads and
snapshots in :mod:`.reads`. The trusted executor reaches these through
:mod:`jobs.execution`; callers of one scope through :mod:`jobs.api`.
"""

from __future__ import annotations

from ..submit_rules import NO_RULES
from .base import current_time
from .batches import get_batch, stage_batch, submit_batch
from .claiming import complete_and_claim
from .expiry import expire_due
from .finishing import (
    asynchronous_commit,
    complete_many,
    finish,
    put_back_unknown_handler,
    snooze,
)
from .progress import (
    execution_statuses,
    expired_tokens,
    heartbeat,
    report_progress,
    tokens_leased_by,
)
from .queues import QueueState, pause, queue_states, resume
from .reads import get, get_due, list_jobs, snapshot
from .recovering import recover
from .retention import purge_finished
from .scoped import cancel, cancel_queued, cancel_running, retry
from .shares import ScopeShare, scope_shares, set_weight
from .submission import stage, stage_many, submit, submit_many
from .waiting import KeyState, Waiting, key_states, why_waiting

__all__ = [
    "NO_RULES",
    "KeyState",
    "QueueState",
    "ScopeShare",
    "Waiting",
    "asynchronous_commit",
    "cancel",
    "cancel_queued",
    "cancel_running",
    "complete_and_claim",
    "complete_many",
    "current_time",
    "execution_statuses",
    "expire_due",
    "expired_tokens",
    "finish",
    "get",
    "get_batch",
    "get_due",
    "heartbeat",
    "key_states",
    "list_jobs",
    "pause",
    "purge_finished",
    "put_back_unknown_handler",
    "queue_states",
    "recover",
    "report_progress",
    "resume",
    "retry",
    "scope_shares",
    "set_weight",
    "snapshot",
    "snooze",
    "stage",
    "stage_batch",
    "stage_many",
    "submit",
    "submit_batch",
    "submit_many",
    "tokens_leased_by",
    "why_waiting",
]
