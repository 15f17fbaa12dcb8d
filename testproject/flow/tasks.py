"""Handlers with limits across every worker (J18) and a timeout (J17), for the
demo and the process tests; installed when ``FLOW_TASKS`` is set."""

from __future__ import annotations

from jobs import JobContext, job_handler


@job_handler("flow.limited", version=1, max_running=2)
def limited(ctx: JobContext) -> str:
    """At most two Running at once, however many workers run."""
    ctx.wait_for_cancel(float(ctx.payload.get("seconds", 0.005)))
    return "limited"


@job_handler("flow.per_tenant", version=1, max_running_per_scope=1)
def per_tenant(ctx: JobContext) -> str:
    """At most one Running per scope."""
    ctx.wait_for_cancel(float(ctx.payload.get("seconds", 0.005)))
    return "per tenant"


@job_handler("flow.rated", version=1, rate=(20, 1))
def rated(ctx: JobContext) -> str:
    """At most 20 starts in any second."""
    return "rated"


@job_handler("flow.stubborn", version=1, timeout=0.5)
def stubborn(ctx: JobContext) -> str:
    """Ignores its timeout's signal for ``seconds``: the worker fails it with
    JobTimedOut after the grace and runs the next job in its slot."""
    import time

    time.sleep(float(ctx.payload.get("seconds", 5)))  # ignores the signal on purpose
    return "too late"
