"""The job handlers of the workflows app: the one that advances runs, and one per
activity (named as the activity) that runs its items.

Registered in every process when Django is ready (``WorkflowsConfig.ready``), and for
each activity when its ``@activity`` runs, so any ``run_jobs`` worker runs them.
"""

from __future__ import annotations

from jobs.conf import jobs_settings
from jobs.handlers import JobContext, Snooze, job_handler
from jobs.store.finishing import MAX_SNOOZES_LIMIT

from .registry import ActivitySpec
from .store import ADVANCE_HANDLER


# Snoozes are how these jobs wait, not a handler asking for time over and over: the
# advance snoozes while no worker has the run's version (a deploy must never fail
# the run for that), an item snoozes between its activity's own retries (which bound
# them). JOBS["MAX_SNOOZES"] must cut neither, so both take the highest bound.
@job_handler(ADVANCE_HANDLER, version=1, timeout=None, max_snoozes=MAX_SNOOZES_LIMIT)
def advance_run(ctx: JobContext) -> None:
    """Advance the run named by the job's payload (see :mod:`workflows.engine`)."""
    from .engine import VersionMissing, advance

    try:
        advance(int(ctx.payload["run"]), ctx.job_id)
    except VersionMissing:
        # A worker without the run's (name, version) leaves the run waiting for one
        # that has it: the job comes back later, never failed for that.
        raise Snooze(jobs_settings().UNKNOWN_HANDLER_RETRY_DELAY) from None


def register_activity_handler(spec: ActivitySpec) -> None:
    """Register the job handler of activity ``spec`` (its name, version 1, its
    timeout), which runs one try of one of its items."""

    def run_activity_item(ctx: JobContext) -> None:
        from .engine import run_item

        run_item(spec, ctx)

    run_activity_item.__qualname__ = f"activity[{spec.name}]"
    job_handler(spec.name, version=1, timeout=spec.timeout, max_snoozes=MAX_SNOOZES_LIMIT)(
        run_activity_item
    )
