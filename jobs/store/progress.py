"""Running attempts: progress, heartbeats and lease renewal, execution status
and the tokens recovery looks for."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import transaction

from ledon.db import adapt_dt, alias_for, connection_for

from .. import validation
from ..conf import jobs_settings
from ..db import fetch, in_list_params
from ..exceptions import (
    AttemptRowMissing,
    InvalidInput,
)
from ..models import Job, JobAttempt
from ..types import (
    AttemptStatus,
    ExecutionStatus,
    JobStatus,
)
from . import sql
from .base import check_token, current_time

logger = logging.getLogger(__name__)


def report_progress(
    token: str, value: float, message: str | None = None, *, now: datetime | None = None
) -> bool:
    """Record progress for the current attempt of a Running job.

    Only when the token is current, no cancel is requested and ``value`` is not
    below the stored value; the attempt row changes in the same transaction.
    Returns False, changing nothing, in every other case.
    """
    token = check_token(token)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"progress must be a finite number, got {value!r}")
    if not 0 <= value <= 100:
        raise InvalidInput(f"progress is a percentage between 0 and 100, got {value!r}")
    text = "" if message is None else validation.text(message, "progress message", 10_000)
    now = current_time(now)
    alias = alias_for(Job)
    connection = connection_for(Job)
    with transaction.atomic(using=alias):
        params = {"progress": float(value), "message": text, "now": adapt_dt(connection, now)}
        rows = fetch(connection, sql.REPORT_PROGRESS, {**params, "token": token})
        if not rows:
            logger.debug("progress not recorded: token not current, cancelled or lower value")
            return False
        if not JobAttempt.objects.filter(
            job_id=rows[0]["id"], token=token, status=AttemptStatus.RUNNING
        ).update(progress=float(value), progress_message=text):
            raise AttemptRowMissing()
    return True


def heartbeat(
    tokens: Sequence[str],
    worker_id: str,
    *,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> dict[str, ExecutionStatus]:
    """Renew the leases of a worker's running attempts; report each token's status.

    A token missing from the renewal (finished, recovered by another worker) is
    ENDED: its handler must stop.
    """
    if not tokens:
        return {}
    now = current_time(now)
    expires = now + timedelta(seconds=lease_seconds or jobs_settings().LEASE_SECONDS)
    alias = alias_for(Job)
    connection = connection_for(Job)
    token_list = [check_token(t) for t in tokens]
    params = {
        "lease_expires_at": adapt_dt(connection, expires),
        "worker_id": worker_id,
        **in_list_params("token", token_list),
    }
    with transaction.atomic(using=alias):
        rows = fetch(connection, sql.renew_leases(len(token_list)), params)
    states = {t: ExecutionStatus.ENDED for t in token_list}
    for row in rows:
        states[row["token"]] = (
            ExecutionStatus.CANCEL_REQUESTED if row["cancel_requested"] else ExecutionStatus.ACTIVE
        )
    return states


def execution_statuses(tokens: Sequence[str]) -> dict[str, ExecutionStatus]:
    """The execution status of many tokens at once; reads the job row's state only,
    never the payload."""
    token_list = [check_token(t) for t in tokens]
    states = {t: ExecutionStatus.ENDED for t in token_list}
    if not token_list:
        return states
    rows = Job.objects.filter(current_token__in=token_list, status=JobStatus.RUNNING).values_list(
        "current_token", "cancel_requested"
    )
    for current, cancel_requested in rows:
        if current is not None:
            states[current] = (
                ExecutionStatus.CANCEL_REQUESTED if cancel_requested else ExecutionStatus.ACTIVE
            )
    return states


def expired_tokens(*, now: datetime | None = None, limit: int = 100) -> list[str]:
    """Tokens of Running attempts whose lease has expired (their worker is gone)."""
    now = current_time(now)
    return [
        t
        for t in Job.objects.lease_expired(now)
        .order_by("lease_expires_at")
        .values_list("current_token", flat=True)[:limit]
        if t is not None
    ]


def tokens_leased_by(worker_id: str) -> list[str]:
    """Tokens of Running attempts leased by ``worker_id`` (a restarted worker's own)."""
    return [
        t
        for t in Job.objects.running()
        .filter(leased_by=worker_id)
        .values_list("current_token", flat=True)
        if t is not None
    ]
