"""Handlers with limits across every worker and a timeout, for the
demo and the process tests; installed when ``FLOW_TASKS`` is set."""

from __future__ import annotations

import time
from pathlib import Path

from jobs import JobContext, Snooze, job_handler


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


@job_handler("flow.sleepy", version=1)
def sleepy(ctx: JobContext) -> str:
    """Snoozes its first execution for ``snooze`` seconds (not a failure, not an
    attempt), then runs."""
    from jobs.models import JobAttempt
    from jobs.types import AttemptStatus

    snoozed = JobAttempt.objects.filter(
        job__scope_hash=ctx.scope_hash, job__job_id=ctx.job_id, status=AttemptStatus.SNOOZED
    ).exists()
    if not snoozed:
        raise Snooze(float(ctx.payload.get("snooze", 0.5)))
    return "awake"


@job_handler("flow.stubborn", version=1, timeout=0.5)
def stubborn(ctx: JobContext) -> str:
    """Ignores its timeout's signal: waits for the file ``gate`` (or ``seconds``), then
    reports progress and returns — too late, the worker failed it with JobTimedOut
    after the grace and ran the next job in its slot. Writes whether the late
    progress was accepted to ``done``."""
    gate = Path(ctx.payload["gate"]) if ctx.payload.get("gate") else None
    until = time.monotonic() + float(ctx.payload.get("seconds", 60))
    while time.monotonic() < until and not (gate and gate.exists()):
        time.sleep(0.01)  # ignores the signal on purpose
    accepted = ctx.report_progress(50, "too late")
    if ctx.payload.get("done"):
        Path(ctx.payload["done"]).write_text(str(accepted))
    return "too late"


@job_handler("flow.fair", version=1)
def fair(ctx: JobContext) -> str:
    """No limit: for the order in which scopes' jobs start (fair share)."""
    ctx.wait_for_cancel(float(ctx.payload.get("seconds", 0.002)))
    return "fair"


@job_handler("flow.per_key", version=1, max_running_per_key=1)
def per_key(ctx: JobContext) -> str:
    """At most one Running per limit key, across scopes and workers."""
    ctx.wait_for_cancel(float(ctx.payload.get("seconds", 0.02)))
    return "per key"


@job_handler("flow.key_rated", version=1, rate_per_key=(10, 1, 5))
def key_rated(ctx: JobContext) -> str:
    """Per limit key, at most 10 units a second on average and 5 at once (a token
    bucket per key, a job's cost counted in units)."""
    return "key rated"


@job_handler("flow.key_window", version=1, rate_per_key=(5, 1))
def key_window(ctx: JobContext) -> str:
    """Per limit key, at most 5 starts in any second (a sliding window per key)."""
    return "key window"
