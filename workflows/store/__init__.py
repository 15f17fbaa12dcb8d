"""Every state transition of runs, checkpoints, items and signals.

Each transition is one guarded statement — it succeeds only from the states that
allow it — inside ``transaction.atomic``, and returns a typed outcome or raises a
typed error. Nothing else in the app writes to the workflows tables.

    create_run / stage ........ (new) -> WAITING + its first advance job     creating
    create_child .............. (new) child of a run, in its fenced write    creating
    take (take_with_steps) .... WAITING (or RUNNING, its own job again) ->   driving
                                RUNNING, new driver token (and the signal
                                it waited for, read); else RUNNING + wake
                                pending
    guard ..................... every checkpoint write: fenced by the token  driving
    give_back ................. RUNNING (token) -> WAITING as before the     driving
                                take (no definition of its version here)
    suspend ................... RUNNING (token, no wake pending) -> WAITING  driving
                                (what for, until when); a pending wake:
                                replay again
    finish .................... RUNNING (token) -> SUCCEEDED | FAILED |      driving
                                CANCELLED
    release ................... RUNNING (its advance job failed for good)    driving
                                -> WAITING + a new advance job
    holds_of_ended_jobs ....... the runs still RUNNING under an advance job  driving
                                that ended for good: the engine releases,
                                fails (its worker kept dying) or cancels
                                each (finish, by the dead driver's token)
    insert_step / update_step . a checkpoint recorded, moved on (fenced)     checkpoints
    record_step ............... the same, the fence in its own statement     checkpoints
    insert_items .............. a map's items and their jobs: one bulk       items
                                submit, a jobs batch whose ``then`` job is
                                the run's advance
    start_item / end_item ..... an unsealed try counted; an end that is not  items
                                its job's own (a failure), on its own row
    record_items .............. the fan-in: how the items ended (their jobs  fanning
                                recorded the successes) onto their rows
    fan_in / items_ended ...... none left -> wake the run (an end on a row,  fanning
                                or an older version's ``then`` job)
    send_signal ............... (new signal); wakes the run if it waits      signalling
                                for it
    cancel .................... WAITING -> CANCELLED; RUNNING -> cancel      control
                                requested
    time_out .................. a cancel past the run's deadline, with its   control
                                RunTimedOut error (its job: deadlines)
    resume .................... FAILED -> WAITING (failed checkpoints        control
                                erased)
    cancel_runs_many /          cancel, resume for a batch of a bulk         many
    resume_runs_many .......... operation (rows other transactions hold
                                are skipped, to try again)
    purge_finished ............ finished before a cutoff -> (deleted)        retention
    fork ...................... (new) WAITING run + copies of the source's   forking
                                checkpoints before a step, its children

A run is woken by an advance job of the workflows' own handler, staged in the same
transaction as the change that wakes it (:mod:`.waking`). Its job id is deterministic
(the run's row id, its generation and what woke it), so two writers that race to
wake a run for the same reason create one job, and a replayed writer finds its job
already there. The bounds of a map are :mod:`.bounds`; snapshots are :mod:`.reads`.
"""

from __future__ import annotations

from .base import Driver, StaleDriver, alias, commit_unflushed, current_time
from .bounds import check_item_count, check_results_size, refuse_hopeless_resume
from .checking import RunInFlight, runs_in_flight
from .checkpoints import (
    RecordedSteps,
    insert_step,
    load_steps,
    load_steps_of,
    record_step,
    update_step,
)
from .control import advance_job_cancelled, cancel, cancel_run, resume, resume_run, time_out
from .creating import create_child, create_run
from .deadlines import deadline_passed, timed_out_error
from .driving import (
    EndedHold,
    SignalAtTake,
    Suspended,
    Taken,
    cancel_requested,
    finish,
    give_back,
    guard,
    holds_of_ended_jobs,
    release,
    suspend,
    take,
    take_with_steps,
)
from .fanning import (
    ITEM_JOB_PREFIX,
    ITEMS_ENDED_HANDLER,
    ended_by_jobs,
    fan_in,
    items_ended,
    items_left,
    items_of,
    items_wake_ended,
    record_items,
    then_job_ended,
)
from .forking import fork, identity
from .items import (
    ITEM_BATCH,
    SealedItem,
    end_item,
    end_items_of_ended_jobs,
    first_items,
    insert_items,
    item_at,
    item_job_cancelled,
    items_per_transaction,
    items_queued,
    record_item_error,
    sealed_item,
    start_item,
)
from .many import cancel_runs_many, resume_runs_many
from .reads import child_run, get, in_flight_versions, list_runs, snapshot, wait_of
from .retention import purge_finished
from .signalling import cancel_and_signal, send_signal, signal_payload
from .tags import carrying
from .waking import (
    ADVANCE_HANDLER,
    ADVANCE_JOB_PREFIX,
    advance_job_prefix,
    advance_scope_hash,
    drop_wakes,
    staged_advance,
    wake,
)

__all__ = [
    "ADVANCE_HANDLER",
    "ADVANCE_JOB_PREFIX",
    "ITEMS_ENDED_HANDLER",
    "ITEM_BATCH",
    "ITEM_JOB_PREFIX",
    "Driver",
    "EndedHold",
    "RecordedSteps",
    "RunInFlight",
    "SealedItem",
    "SignalAtTake",
    "StaleDriver",
    "Suspended",
    "Taken",
    "advance_job_cancelled",
    "advance_job_prefix",
    "advance_scope_hash",
    "alias",
    "cancel",
    "cancel_and_signal",
    "cancel_requested",
    "cancel_run",
    "cancel_runs_many",
    "carrying",
    "check_item_count",
    "check_results_size",
    "child_run",
    "commit_unflushed",
    "create_child",
    "create_run",
    "current_time",
    "deadline_passed",
    "drop_wakes",
    "end_item",
    "end_items_of_ended_jobs",
    "ended_by_jobs",
    "fan_in",
    "finish",
    "first_items",
    "fork",
    "get",
    "give_back",
    "guard",
    "holds_of_ended_jobs",
    "identity",
    "in_flight_versions",
    "insert_items",
    "insert_step",
    "item_at",
    "item_job_cancelled",
    "items_ended",
    "items_left",
    "items_of",
    "items_per_transaction",
    "items_queued",
    "items_wake_ended",
    "list_runs",
    "load_steps",
    "load_steps_of",
    "purge_finished",
    "record_item_error",
    "record_items",
    "record_step",
    "refuse_hopeless_resume",
    "release",
    "resume",
    "resume_run",
    "resume_runs_many",
    "runs_in_flight",
    "sealed_item",
    "send_signal",
    "signal_payload",
    "snapshot",
    "staged_advance",
    "start_item",
    "suspend",
    "take",
    "take_with_steps",
    "then_job_ended",
    "time_out",
    "timed_out_error",
    "update_step",
    "wait_of",
    "wake",
]
