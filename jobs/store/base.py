"""What every module of the store shares: the clock, wake-ups, checks of input."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ledon import clock
from ledon.db import is_postgres

from .. import validation
from ..conf import jobs_settings
from ..db import fetch
from ..exceptions import InvalidInput, InvalidSubmission
from ..fair_share import place
from ..types import (
    JobStatus,
)
from . import sql

#: Rows per statement of a bulk write on SQLite (an insert of 19 parameters a row;
#: SQLite accepts 32,766 parameters per statement) and jobs per read of a batch.
CHUNK_ROWS = 500


def current_time(now: datetime | None = None) -> datetime:
    """The time a transition is recorded at: ``now`` (checked to be aware, in UTC) or,
    when None, the current time."""
    return clock.current_time(now, error=InvalidSubmission)


def notify(connection: BaseDatabaseWrapper, queue: str) -> None:
    """Wake PostgreSQL workers. Sent inside the writing transaction: delivered on commit."""
    if is_postgres(connection):
        fetch(connection, sql.NOTIFY, {"channel": jobs_settings().NOTIFY_CHANNEL, "payload": queue})


def notify_cancel(connection: BaseDatabaseWrapper) -> None:
    """Tell PostgreSQL workers that a cancel was requested (delivered on commit)."""
    if is_postgres(connection):
        channel = jobs_settings().NOTIFY_CHANNEL + "_cancel"
        fetch(connection, sql.NOTIFY, {"channel": channel, "payload": ""})


def requeue_fields(run_at: datetime, now: datetime) -> dict[str, Any]:
    return {
        "status": JobStatus.QUEUED,
        "next_run_at": run_at,
        # Its place in line: that of a job submitted for run_at.
        "fair_at": place(run_at),
        "progress": None,
        "progress_message": "",
        "error": "",
        "cancel_requested": False,
        "result_ref": None,
        **sql.LEFT_RUNNING,
        # Its last execution's counts were given back when it ended.
        "limit_keys": None,
        # A retry of a job that kept killing its worker gives it another run.
        "keeps_killing_worker": False,
        "started_at": None,
        "finished_at": None,
        "updated_at": now,
        # Queued again for another reason than an unknown handler: a new window if that
        # comes up.
        "handler_unknown_since": None,
    }


def check_result_ref(value: str | None) -> str | None:
    if value is None:
        return None
    return validation.text(value, "result_ref", validation.MAX_TEXT_LENGTH)


def check_token(token: object) -> str:
    if not isinstance(token, str) or not token or len(token) > 64:
        raise InvalidInput("token must be a non-empty str of at most 64 characters")
    return token
