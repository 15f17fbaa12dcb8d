"""Helpers for testing your own code that submits or stages jobs.

``run_jobs_inline()`` runs due jobs one by one in the calling thread, on its database
connection — so it also sees what a ``TestCase``'s open transaction wrote — through
the same store transitions and handler rules as ``manage.py run_jobs`` (one function,
:func:`jobs.attempts.run_attempt`, decides for both): failures are recorded with their
traceback and retried per the handler's policy, cancellation and token fencing apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from . import execution
from .attempts import Ending, run_attempt
from .handlers import JobContext, autodiscover
from .signals import finished_attempt
from .types import Claim, FinishOutcome


@dataclass(frozen=True, slots=True)
class InlineRun:
    """One attempt run by :func:`run_jobs_inline` and how it ended."""

    job_id: str
    handler: str
    attempt: int
    outcome: FinishOutcome
    error: str = ""


def run_jobs_inline(
    *,
    queues: Sequence[str] | None = None,
    max_attempts_run: int = 1000,
    worker_id: str = "inline",
    now: datetime | None = None,
) -> list[InlineRun]:
    """Run due jobs in this thread until none is due (or ``max_attempts_run`` ran).

    Like ``manage.py run_jobs``, it first imports each installed app's ``tasks``
    module (and the tasks backend's ``MODULES``), so the handlers are registered
    even if nothing in the test imported them. A retry scheduled for later is not
    due yet and is left queued; pass ``now`` to run as if at another time (every
    attempt and its finish then use that time).
    """
    autodiscover()
    runs: list[InlineRun] = []
    while len(runs) < max_attempts_run:
        at = now or timezone.now()
        claims = execution.claim_due(worker_id, limit=1, queues=queues, now=at)
        if not claims:
            break
        runs.append(_run(claims[0], at))
    return runs


def _run(claim: Claim, now: datetime) -> InlineRun:
    end = run_attempt(JobContext(claim), clock=lambda: now)
    outcome = end.write(claim.token, now=now)
    retry_scheduled = end.ending is Ending.FAILED and outcome is FinishOutcome.REQUEUED
    finished_attempt(claim, outcome, retry_scheduled=retry_scheduled)  # for metrics
    return InlineRun(claim.job_id, claim.handler, claim.attempt, outcome, end.error)
