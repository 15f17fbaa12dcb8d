"""What the jobs tell the workflows (receivers of ``jobs.signals``, connected by
``WorkflowsConfig.wire_up``): an engine job that ended for good outside its
handler's code, or was cancelled, ends what it was staged for, so that no run waits
for a job that will never come back. Only the jobs the engine staged do any of this
(their scope and id are checked by the store).
"""

from __future__ import annotations

import logging
from typing import Any

from jobs.types import Claim, FinishOutcome
from ledon.values import CancelOutcome

from . import store
from .engine import current_time, let_go_runs_of_ended_jobs

logger = logging.getLogger(__name__)


def on_attempt_finished(
    sender: Any, *, claim: Claim, outcome: FinishOutcome, retry_scheduled: bool, **kwargs: Any
) -> None:
    """``jobs.signals.attempt_finished``: an item job that ended for good outside its
    activity's code (its activity unknown to every worker that claimed it, its last
    try past its timeout, its worker killed with no attempt left) ends its item, so
    that the run is not left waiting for it; an advance job that did lets go of its
    run (one rule for every end of an advance job:
    :func:`workflows.engine.let_go_runs_of_ended_jobs`). An item job that ended
    Cancelled without its handler recording the item (cancelled while it waited in a
    worker's look-ahead) ends its item Cancelled; a cancelled advance job cancels its
    run; the job that wakes a run after its map's items, failed for good, wakes it
    once more. Only the jobs the engine staged do any of this (their scope and id are
    checked)."""
    if outcome is FinishOutcome.CANCELLED:
        on_queued_job_cancelled(sender, scope_hash=claim.scope_hash, job_id=claim.job_id)
        return
    if outcome not in (FinishOutcome.FAILED, FinishOutcome.INTERRUPTED) or retry_scheduled:
        return
    if claim.handler == store.ADVANCE_HANDLER:
        if claim.scope_hash == store.advance_scope_hash():
            now = current_time()
            if not let_go_runs_of_ended_jobs(now, limit=1, job_id=claim.job_id):
                # The wake after a map's items, failed for good before it took the
                # run: the run is woken once more (nothing else would wake it).
                store.items_wake_ended(claim.job_id, now)
        return
    if claim.handler == store.ITEMS_ENDED_HANDLER:
        # The job that wakes a run after its map's items failed for good (its tries
        # spent on an outage): the wake is tried once more, as its handler would.
        store.then_job_ended(claim.scope_hash, claim.job_id, claim.payload, current_time())
        return
    _end_item_of(claim.scope_hash, claim.job_id)


def _end_item_of(scope_hash: str, job_id: str) -> None:
    """The item job ``job_id`` of scope ``scope_hash`` ended for good without recording
    its item: the item ends as its job did (one rule, whoever heard of it: see
    :func:`workflows.store.end_items_of_ended_jobs`). Any other job: no query."""
    if job_id.startswith(store.ITEM_JOB_PREFIX):
        store.end_items_of_ended_jobs(current_time(), limit=1, job=(scope_hash, job_id))


def on_queued_job_cancelled(sender: Any, *, scope_hash: str, job_id: str, **kwargs: Any) -> None:
    """``jobs.signals.queued_job_cancelled``: an item job cancelled before any attempt
    ran it ends its item Cancelled, so that its run is not left waiting for it (the
    step then fails like one whose item failed). A run's advance job cancelled (in the
    jobs admin) cancels the run: nothing else would ever advance it."""
    now = current_time()
    if store.item_job_cancelled(scope_hash, job_id, now):
        return
    outcome = store.advance_job_cancelled(scope_hash, job_id, now)
    if outcome is not None and outcome is not CancelOutcome.ALREADY_FINISHED:
        logger.warning(
            "workflow run cancelled (%s): its advance job %s was cancelled; cancel a run "
            "with WorkflowScope.cancel or on its admin page, not through its jobs",
            outcome.value,
            job_id,
            extra={"job_id": job_id},
        )


def on_job_keeps_killing_worker(
    sender: Any, *, scope_hash: str, job_id: str, handler: str, **kwargs: Any
) -> None:
    """``jobs.signals.job_keeps_killing_worker``: an engine job whose worker kept dying
    ended Interrupted at the crash budget, recovered by whichever process found it
    (which sends no ``attempt_finished``). Its run ends Failed at once
    (``KeepsKillingWorker``: a new advance would run the same step again), or its
    item ends and the run goes on, instead of waiting for the upkeep's next pass."""
    if handler == store.ADVANCE_HANDLER:
        if scope_hash == store.advance_scope_hash():
            let_go_runs_of_ended_jobs(current_time(), limit=1, job_id=job_id)
    else:
        _end_item_of(scope_hash, job_id)
