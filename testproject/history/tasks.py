"""The workload's job handlers and workflow (imported by every worker's autodiscovery).

Every effect is written with its ids (:class:`~testproject.history.models.Effect`):
a job handler's in a transaction of its own (a handler runs at least once), an
inline step's in its checkpoint's transaction (once), an activity's in its own (at
least once).

``HISTORY_CLOCK_RULES=on`` in the environment adds the clock-skew test's handlers:
``history.rated``, under a rate limit, and ``history.tick``, the job of the schedule
``history-tick`` (every two seconds); each records when it ran, on the database's
clock. No other process of the suite declares them.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from django.db import transaction

from jobs import JobContext, job_handler, periodic
from jobs.handlers import RetryPolicy
from workflows import WorkflowContext, activity, workflow

from .models import Effect
from .workload import (
    ITEMS_PER_RUN,
    JOB_HANDLER,
    RATE_COUNT,
    RATE_SECONDS,
    SIGNAL,
    TICK_SECONDS,
    WORKFLOW,
)


def record(kind: str, subject: str, key: str, attempt: int = 0) -> None:
    Effect.objects.create(kind=kind, subject=subject, key=key, attempt=attempt, pid=os.getpid())


@job_handler(JOB_HANDLER, version=1, retry=RetryPolicy(base_delay=0, jitter=0))
def job(ctx: JobContext) -> str:
    """A short job whose effect commits on its own, before the attempt is finished."""
    with transaction.atomic():
        record(Effect.Kind.JOB, ctx.job_id, ctx.token, ctx.attempt)
    return "done"


if os.environ.get("HISTORY_CLOCK_RULES") == "on":
    # Only the clock-skew test's processes: a handler with a rate makes every claim
    # of its process a claim under limits.

    @job_handler("history.rated", version=1, rate=(RATE_COUNT, RATE_SECONDS))
    def rated(ctx: JobContext) -> str:
        """A job under a rate limit across every worker; its effect is its start."""
        with transaction.atomic():
            record(Effect.Kind.JOB, ctx.job_id, ctx.token, ctx.attempt)
        return "done"

    @periodic(timedelta(seconds=TICK_SECONDS), name="history-tick")
    @job_handler("history.tick", version=1)
    def tick(ctx: JobContext) -> str:
        """A schedule's period: its effect says when it ran."""
        with transaction.atomic():
            record(Effect.Kind.TICK, ctx.job_id, ctx.token, ctx.attempt)
        return "ticked"


def step(run_id: str, key: str, value: Any = None) -> Any:
    """An inline step: its effect commits with its checkpoint or not at all."""
    record(Effect.Kind.STEP, run_id, key)
    return value


@activity("history.price", retries=5)
def price(item: dict[str, Any]) -> int:
    """An activity item: its effect commits on its own (at least once per item)."""
    with transaction.atomic():
        record(Effect.Kind.ACTIVITY, item["run"], str(item["line"]))
    return 10 * (int(item["line"]) + 1)


@workflow(WORKFLOW, version=1)
def order(wf: WorkflowContext) -> dict[str, Any]:
    """Reserve, price the lines in parallel, cool off (a timer), wait for the order's
    message (a signal its consumer sends), record the payment."""
    wf.step("reserve", step, wf.run_id, "reserve")
    prices = wf.map("price", price, [{"run": wf.run_id, "line": n} for n in range(ITEMS_PER_RUN)])
    wf.sleep("cool-off", wf.input["sleep"])
    wf.step("after-sleep", step, wf.run_id, "after-sleep")
    paid = wf.wait_for_signal(SIGNAL)
    wf.step("payment", step, wf.run_id, "payment", paid["message"])
    return {"total": sum(prices), "message": paid["message"]}
