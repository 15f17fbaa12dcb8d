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
from .base import check_token, current_time, notify
from .finishing import Finishing, finish_batch
from .sql import ATTEMPT, JOB, QUEUED, RUNNING

RELEASED = AttemptStatus.RELEASED.value

#: The job Running under ``token``, without a cancel request, Queued again as it was
#: before the claim (its ``next_run_at`` kept: it was due). Returns ``id``, ``queue``.
RELEASE_JOB = (
    f"UPDATE {JOB} SET status = '{QUEUED}',"
    " attempt_count = attempt_count - 1, release_count = release_count + 1,"
    " current_token = NULL, leased_by = '', lease_expires_at = NULL, started_at = NULL,"
    " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
    " finished_at = NULL, updated_at = %(now)s"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}' AND NOT cancel_requested"
    " RETURNING id, queue"
)

#: The released job's (``job``) Running attempt row under ``token`` ends Released
#: with ``reason``. Returns its ``id``.
RELEASE_ATTEMPT = (
    f"UPDATE {ATTEMPT} SET status = '{RELEASED}', finished_at = %(now)s, error = %(reason)s"
    f" WHERE job_id = %(job)s AND token = %(token)s AND status = '{RUNNING}' RETURNING id"
)


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
        rows = fetch(connection, RELEASE_JOB, params)
        if not rows:
            # Stale, or a cancel request committed first: the finish rule decides
            # (Cancelled); a stale token finds nothing.
            finished = finish_batch(
                connection, [Finishing(token, AttemptStatus.INTERRUPTED, error=reason)], now
            ).get(token)
            return FinishOutcome.STALE if finished is None else FinishOutcome(finished.status.value)
        job = rows[0]
        if not fetch(connection, RELEASE_ATTEMPT, {**params, "job": job["id"]}):
            raise AttemptRowMissing()
        notify(connection, job["queue"])
    return FinishOutcome.RELEASED
