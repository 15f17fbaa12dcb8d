"""The job handlers of the workflows app: the one that advances runs, the one that
wakes a run once its map's item jobs all ended, and one per activity (named as the
activity) that runs its items.

Registered in every process by the app's config when Django is ready
(``WorkflowsConfig.wire_up``): the advance's and the wake's when this module is
imported, an activity's as the registry records it (those declared before and after
ready alike, through :func:`workflows.registry.watch_activities`), so any
``run_jobs`` worker runs them. All act only on what their job was staged for (its
scope and id are checked, see :func:`workflows.store.staged_advance`,
:func:`workflows.store.items_ended`, and :func:`workflows.store.sealed_item` or
:func:`workflows.store.start_item`): a job of another scope, or with another id,
fails with :class:`~workflows.exceptions.UntrustedJob` and touches no run or item.
"""

from __future__ import annotations

import random

from jobs.conf import jobs_settings
from jobs.exceptions import JobsError
from jobs.handlers import JobContext, RetryPolicy, Snooze, job_handler
from jobs.store.finishing import MAX_SNOOZES_LIMIT

from .conf import retry_pace
from .engine import VersionMissing, advance, current_time, run_item
from .exceptions import InvalidWorkflow
from .registry import ActivitySpec
from .store import ADVANCE_HANDLER, ITEMS_ENDED_HANDLER, items_ended, staged_advance


# The advance snoozes while no worker has the run's version (a deploy must never
# fail the run for that), so JOBS["MAX_SNOOZES"] must not cut it: it takes the
# highest bound. The library=True: the jobs admin hides its jobs unless asked.
@job_handler(ADVANCE_HANDLER, version=1, timeout=None, max_snoozes=MAX_SNOOZES_LIMIT, library=True)
def advance_run(ctx: JobContext) -> None:
    """Advance the run the job was staged for (see :mod:`workflows.engine`)."""
    run_pk = staged_advance(ctx.scope_hash, ctx.job_id, ctx.payload)
    try:
        advance(run_pk, ctx.job_id)
    except VersionMissing:
        # A worker without the run's (name, version) leaves the run waiting for one
        # that has it: the job comes back later, never failed for that.
        raise Snooze(jobs_settings().UNKNOWN_HANDLER_RETRY_DELAY) from None


@job_handler(ITEMS_ENDED_HANDLER, version=1, max_snoozes=MAX_SNOOZES_LIMIT, library=True)
def wake_after_items(ctx: JobContext) -> None:
    """The ``then`` job of the item jobs of a map staged by an earlier version (a
    map's is now the run's advance), queued by the statement that ended the last of
    them: wake the run (see :func:`workflows.store.items_ended`)."""
    items_ended(ctx.scope_hash, ctx.job_id, ctx.payload, current_time())


class ActivityRetry(RetryPolicy):
    """The back-off between an activity's tries (its item job's attempts): the
    inline steps' own, ``WORKFLOWS``' ``RETRY_*`` keys, read at each retry."""

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        return retry_pace().delay(attempt, rng)


def register_activity_handler(spec: ActivitySpec) -> None:
    """Register the job handler of activity ``spec`` (its name, version 1, its
    timeout and limits), which runs one try of one of its items; its retries are
    the item jobs' attempts, paced by :class:`ActivityRetry`. A handler the jobs
    refuse (a job handler of that name already, a bad limit) is
    :class:`~workflows.exceptions.InvalidWorkflow`."""

    def run_activity_item(ctx: JobContext) -> str | None:
        return run_item(spec, ctx)

    run_activity_item.__qualname__ = f"activity[{spec.name}]"
    # Snoozes wait out a database outage while the item is read or recorded (no
    # attempt used): the highest bound, like the advance's.
    try:
        job_handler(
            spec.name,
            version=1,
            timeout=spec.timeout,
            retry=ActivityRetry(),
            max_snoozes=MAX_SNOOZES_LIMIT,
            max_running=spec.max_running,
            max_running_per_scope=spec.max_running_per_scope,
            rate=spec.rate,
        )(run_activity_item)
    except JobsError as exc:
        raise InvalidWorkflow(f"activity {spec.name!r}: {exc}") from None
