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
    extend_batch .............. (a batch staged with more to come) -> its   batches
                                later jobs QUEUED

Every move into, out of or between final states also moves the job's batch and
sequence, in the same transaction: :mod:`.endings`.

Why a Queued job waits, and each limit key's state, are reads in :mod:`.waiting`.

Claims under limits are in :mod:`.limits`.

Progress, heartbeats and execution status live in :mod:`.progress`, reads and
snapshots in :mod:`.reads`. The trusted executor reaches these through
:mod:`jobs.execution`; callers of one scope through :mod:`jobs.api`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import exported, lazy_attributes

from ..submit_rules import NO_RULES as NO_RULES

# Each name's module is imported when the name is first used: a worker loads the
# transitions it runs, not the admin's bulk operations nor the reads of why a job waits.
if TYPE_CHECKING:  # for type checkers; ``as`` marks each name as re-exported
    from .base import current_time as current_time
    from .batches import extend_batch as extend_batch
    from .batches import get_batch as get_batch
    from .batches import stage_batch as stage_batch
    from .batches import submit_batch as submit_batch
    from .claiming import complete_and_claim as complete_and_claim
    from .expiry import expire_due as expire_due
    from .finishing import asynchronous_commit as asynchronous_commit
    from .finishing import complete_many as complete_many
    from .finishing import finish as finish
    from .finishing import put_back_unknown_handler as put_back_unknown_handler
    from .finishing import snooze as snooze
    from .progress import execution_statuses as execution_statuses
    from .progress import expired_tokens as expired_tokens
    from .progress import heartbeat as heartbeat
    from .progress import report_progress as report_progress
    from .progress import tokens_leased_by as tokens_leased_by
    from .queues import QueueState as QueueState
    from .queues import pause as pause
    from .queues import queue_states as queue_states
    from .queues import resume as resume
    from .reads import get as get
    from .reads import get_due as get_due
    from .reads import list_jobs as list_jobs
    from .reads import snapshot as snapshot
    from .recovering import recover as recover
    from .retention import purge_finished as purge_finished
    from .scoped import cancel as cancel
    from .scoped import cancel_queued as cancel_queued
    from .scoped import cancel_running as cancel_running
    from .scoped import retry as retry
    from .shares import ScopeShare as ScopeShare
    from .shares import scope_shares as scope_shares
    from .shares import set_weight as set_weight
    from .submission import stage as stage
    from .submission import stage_many as stage_many
    from .submission import submit as submit
    from .submission import submit_many as submit_many
    from .waiting import KeyState as KeyState
    from .waiting import Waiting as Waiting
    from .waiting import key_states as key_states
    from .waiting import why_waiting as why_waiting

_LAZY = exported(
    {
        "base": ("current_time",),
        "batches": (
            "get_batch",
            "stage_batch",
            "extend_batch",
            "submit_batch",
        ),
        "claiming": ("complete_and_claim",),
        "expiry": ("expire_due",),
        "finishing": (
            "asynchronous_commit",
            "complete_many",
            "finish",
            "put_back_unknown_handler",
            "snooze",
        ),
        "progress": (
            "execution_statuses",
            "expired_tokens",
            "heartbeat",
            "report_progress",
            "tokens_leased_by",
        ),
        "queues": (
            "QueueState",
            "pause",
            "queue_states",
            "resume",
        ),
        "reads": (
            "get",
            "get_due",
            "list_jobs",
            "snapshot",
        ),
        "recovering": ("recover",),
        "retention": ("purge_finished",),
        "scoped": (
            "cancel",
            "cancel_queued",
            "cancel_running",
            "retry",
        ),
        "shares": (
            "ScopeShare",
            "scope_shares",
            "set_weight",
        ),
        "submission": (
            "stage",
            "stage_many",
            "submit",
            "submit_many",
        ),
        "waiting": (
            "KeyState",
            "Waiting",
            "key_states",
            "why_waiting",
        ),
    }
)
__all__ = sorted([*_LAZY, "NO_RULES"])
__getattr__ = lazy_attributes(__name__, _LAZY)
