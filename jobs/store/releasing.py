"""Releasing a claim: the worker gives back, at its graceful shutdown, an attempt
whose handler its own shutdown signal stopped, or that it claimed and never started.

Running -> Queued in one guarded statement (the token current, the job Running, no
cancel request): the attempt count goes back down and the job's ``release_count`` up,
so the claim never counts against ``max_attempts``; the attempt row ends Released
in the same transaction. A cancel request that committed first ends the job
Cancelled instead, as a finish would; a stale token changes nothing.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from ledon.db import adapt_dt, alias_for, connection_for

from .. import validation
from ..db import fetch
from ..exceptions import AttemptRowMissing
from ..models import Job
from ..types import AttemptStatus, FinishOutcome
from . import sql_flow
from .base import check_token, current_time, notify
from .finishing import Finishing, finish_batch, give_back


def release(token: str, reason: str, *, now: datetime | None = None) -> FinishOutcome:
    """Give the claim under ``token`` back unused: the job Queued again, its attempt
    count restored, the attempt row Released with ``reason`` (``RELEASED``).

    A cancel request that committed first ends the job Cancelled (``CANCELLED``); a
    token that is not current changes nothing (``STALE``); a missing attempt row
    fails the whole transition (``AttemptRowMissing``) and changes nothing.
    """
    token = check_token(token)
    reason = validation.text(reason, "reason", validation.MAX_TEXT_LENGTH)
    now = current_time(now)
    connection = connection_for(Job)
    params = {"token": token, "now": adapt_dt(connection, now), "reason": reason}
    with transaction.atomic(using=alias_for(Job)):
        rows = fetch(connection, sql_flow.RELEASE_JOB, params)
        if not rows:
            # Stale, or a cancel request committed first: the finish rule decides
            # (Cancelled); a stale token finds nothing.
            finished = finish_batch(
                connection, [Finishing(token, AttemptStatus.INTERRUPTED, error=reason)], now
            ).get(token)
            return FinishOutcome.STALE if finished is None else FinishOutcome(finished.status.value)
        job = rows[0]
        if not fetch(connection, sql_flow.RELEASE_ATTEMPT, {**params, "job": job["id"]}):
            raise AttemptRowMissing()
        give_back(connection, job["limit_keys"])
        notify(connection, job["queue"])
    return FinishOutcome.RELEASED
