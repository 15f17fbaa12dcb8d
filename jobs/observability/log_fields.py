"""The structured fields of the jobs engines' log lines: every line about an
attempt carries them in ``extra=``, so that a JSON formatter (see
``docs/operations.md``) gives each its own key."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..types import Claim

#: Characters of a token logged: enough to tell attempts apart, not the capability.
TOKEN_PREFIX = 8


def attempt_fields(claim: Claim, *, now: datetime | None = None, **more: Any) -> dict[str, Any]:
    """``worker``, ``job_id``, ``scope_hash``, ``attempt``, ``token`` (its prefix),
    ``queue``, ``handler`` and, given ``now``, ``duration`` (seconds since the claim),
    then ``more``."""
    fields: dict[str, Any] = {
        "worker": claim.worker_id,
        "job_id": claim.job_id,
        "scope_hash": claim.scope_hash,
        "attempt": claim.attempt,
        "token": claim.token[:TOKEN_PREFIX],
        "queue": claim.queue,
        "handler": claim.handler,
    }
    if now is not None and claim.started_at is not None:
        fields["duration"] = round((now - claim.started_at).total_seconds(), 6)
    fields.update(more)
    return fields
