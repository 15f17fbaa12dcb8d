"""The raw SQL of snoozes, releases, recoveries, pauses, put-backs and expiry, as
named builders in the manner of :mod:`jobs.store.sql`: named parameters, named result
columns, the PostgreSQL and SQLite forms side by side, cached texts. (Claims under
limits are :mod:`jobs.store.sql_limits`.)
"""

from __future__ import annotations

import functools

from ledon.db import id_among_locked

from ..types import JobStatus
from .sql import (
    ATTEMPT,
    CANCELLED,
    INTERRUPTED,
    JOB,
    LEAVE_RUNNING,
    QUEUE,
    QUEUED,
    RUNNING,
)
from .sql_endings import ENDING_COLUMNS

SNOOZED = "snoozed"

# --------------------------------------------------------------------------- pause


#: Pause queue ``name`` at ``now`` — a new row, or a resumed one paused again.
#: Returns the ``name`` if it was not paused already.
PAUSE_QUEUE = (
    f"INSERT INTO {QUEUE} (name, paused, paused_at, updated_at)"
    " VALUES (%(name)s, TRUE, %(now)s, %(now)s)"
    " ON CONFLICT (name) DO UPDATE SET paused = TRUE, paused_at = excluded.paused_at,"
    f" updated_at = excluded.updated_at WHERE NOT {QUEUE}.paused RETURNING name"
)

#: Resume queue ``name`` at ``now``; returns the ``name`` if it was paused.
RESUME_QUEUE = (
    f"UPDATE {QUEUE} SET paused = FALSE, paused_at = NULL, updated_at = %(now)s"
    " WHERE name = %(name)s AND paused RETURNING name"
)


# --------------------------------------------------------------------------- snooze


#: A job Queued again counts in no limit counter (a claim without limits leaves
#: ``limit_keys`` as it is); the statement returns the counters it counted in before,
#: read in the statement's snapshot, to give their counts back.
_COUNTED_BEFORE = f"(SELECT was.limit_keys FROM {JOB} AS was WHERE was.id = {JOB}.id) AS limit_keys"


#: Snooze: queue the job Running under ``token`` again at ``run_at`` (``now``; its place
#: in line ``run_at_place``, as a job submitted for then), unless
#: a cancel request committed first or the job snoozed ``max_snoozes`` times already;
#: the execution is taken back from ``attempt_count`` and counted in ``snooze_count``
#: instead. Returns the job's ``id``, ``queue`` and ``limit_keys``.
SNOOZE_JOB = (
    f"UPDATE {JOB} SET status = '{QUEUED}', next_run_at = %(run_at)s,"
    " fair_at = %(run_at_place)s,"
    " attempt_count = attempt_count - 1, snooze_count = snooze_count + 1,"
    f" {LEAVE_RUNNING}, started_at = NULL,"
    " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
    " finished_at = NULL, handler_unknown_since = NULL, limit_keys = NULL, updated_at = %(now)s"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}' AND NOT cancel_requested"
    f" AND snooze_count < %(max_snoozes)s RETURNING id, queue, {_COUNTED_BEFORE}"
)

#: Why a snooze of the job Running under ``token`` did not happen: its cancel
#: flag and snooze count, with its handler (no row: the token is stale).
SNOOZE_REFUSED = (
    f"SELECT cancel_requested, snooze_count, handler FROM {JOB}"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}'"
)


def _end_attempt(status: str, text: str) -> str:
    """The Running attempt row under ``token`` of the job ``job`` (a snoozed, released
    or recovered job, changed by the same transaction) ends ``status`` at ``now``, with
    the parameter ``text`` as its error. Returns its ``id``."""
    return (
        f"UPDATE {ATTEMPT} SET status = '{status}', finished_at = %(now)s, error = %({text})s"
        f" WHERE job_id = %(job)s AND token = %(token)s AND status = '{RUNNING}' RETURNING id"
    )


#: Snooze: the snoozed job's (``job``) Running attempt row under ``token`` ends Snoozed
#: with ``note``. Returns its ``id``.
SNOOZE_ATTEMPT = _end_attempt(SNOOZED, "note")


# --------------------------------------------------------------------------- release

RELEASED = "released"

#: Release: the job Running under ``token``, without a cancel request, Queued again as
#: it was before the claim (its ``next_run_at`` kept: it was due), the claim taken back
#: from ``attempt_count`` and counted in ``release_count``; like every re-queue but a
#: put-back it starts a new unknown-handler window. Returns the job's ``id``,
#: ``queue`` and the ``limit_keys`` it counted in, to give their counts back.
RELEASE_JOB = (
    f"UPDATE {JOB} SET status = '{QUEUED}',"
    " attempt_count = attempt_count - 1, release_count = release_count + 1,"
    f" {LEAVE_RUNNING}, started_at = NULL,"
    " progress = NULL, progress_message = '', error = '', result_ref = NULL,"
    " finished_at = NULL, handler_unknown_since = NULL, limit_keys = NULL, updated_at = %(now)s"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}' AND NOT cancel_requested"
    f" RETURNING id, queue, {_COUNTED_BEFORE}"
)

#: Release: the released job's (``job``) Running attempt row under ``token`` ends
#: Released with ``reason``. Returns its ``id``.
RELEASE_ATTEMPT = _end_attempt(RELEASED, "reason")


# --------------------------------------------------------------------------- recovery
#
# The crash budget. An attempt recovered because its worker died or outlived its
# shutdown's grace is counted in the job's ``interruption_count`` instead of its
# ``attempt_count``. While the count, this interruption included, stays below
# ``max_interruptions`` the job is Queued again at once; the interruption that reaches
# it ends the job Interrupted as one that keeps killing its worker. A cancel request
# that committed first ends the job Cancelled, as a finish would (the attempt counted).

#: The recovered job is Queued again.
_BACK = "NOT cancel_requested AND interruption_count + 1 < %(max_interruptions)s"
#: The recovery reaches the budget: the job keeps killing its worker.
_SPENT = "NOT cancel_requested AND interruption_count + 1 >= %(max_interruptions)s"


@functools.lru_cache(maxsize=4)
def recover_job(*, lease_guard: bool = False, owner_guard: bool = False) -> str:
    """Recovery with re-queue of the job Running under ``token``, as the crash budget
    says (parameters ``max_interruptions``, ``now``; its error ``summary``, or with the
    budget reached ``spent``). With ``lease_guard`` only
    if its lease expired before ``lease_expired_before``; with ``owner_guard`` only
    if ``leased_by`` holds it (recovery never robs a live worker). Queued again, it is
    due at once and starts a new unknown-handler window; like every way out of Running
    it drops its limit counters. Returns the job's ``id``, new ``status``,
    ``scope_hash``, ``job_id``, ``handler``, ``queue``, ``interruption_count`` and the
    ``limit_keys`` it counted in, to give their counts back."""
    guard = f"current_token = %(token)s AND status = '{RUNNING}'"
    if lease_guard:
        guard += " AND lease_expires_at < %(lease_expired_before)s"
    if owner_guard:
        guard += " AND leased_by = %(leased_by)s"
    kept = "CASE WHEN cancel_requested THEN {0} ELSE {0} {1} END"
    return (
        f"UPDATE {JOB} SET"
        f" status = CASE WHEN cancel_requested THEN '{CANCELLED}' WHEN {_BACK} THEN '{QUEUED}'"
        f" ELSE '{INTERRUPTED}' END,"
        f" attempt_count = {kept.format('attempt_count', '- 1')},"
        f" interruption_count = {kept.format('interruption_count', '+ 1')},"
        f" keeps_killing_worker = {_SPENT},"
        f" next_run_at = CASE WHEN {_BACK} THEN %(now)s ELSE next_run_at END,"
        f" started_at = CASE WHEN {_BACK} THEN NULL ELSE started_at END,"
        f" finished_at = CASE WHEN {_BACK} THEN NULL ELSE %(now)s END,"
        f" progress = CASE WHEN {_BACK} THEN NULL ELSE progress END,"
        f" progress_message = CASE WHEN {_BACK} THEN '' ELSE progress_message END,"
        f" handler_unknown_since = CASE WHEN {_BACK} THEN NULL ELSE handler_unknown_since END,"
        f" error = CASE WHEN {_SPENT} THEN %(spent)s ELSE %(summary)s END,"
        f" result_ref = NULL, limit_keys = NULL, {LEAVE_RUNNING}, updated_at = %(now)s"
        f" WHERE {guard}"
        " RETURNING id, status, scope_hash, job_id, handler, queue, interruption_count,"
        f" batch_id, sequence_key, {_COUNTED_BEFORE}"
    )


#: Recovery: the recovered job's (``job``) Running attempt row under ``token`` ends
#: Interrupted with ``reason``, whatever its job became. Returns its ``id``.
RECOVER_ATTEMPT = _end_attempt(INTERRUPTED, "reason")


# --------------------------------------------------------------------------- put back


#: A worker without the job's handler: undo the claim under ``token`` (job Running) —
#: the attempt count goes back down — and decide: a cancel request that committed first
#: ends the job Cancelled; once the job's first such claim (``handler_unknown_since``,
#: set by the first) is at or before ``window_start`` it ends Failed with ``failed``;
#: else it is Queued again at ``run_at`` (its place ``run_at_place``), with ``waiting`` as
#: its error. Returns the job's new ``status``.
_OVER = "COALESCE(handler_unknown_since, %(now)s) <= %(window_start)s"
PUT_BACK_UNKNOWN_HANDLER = (
    f"UPDATE {JOB} SET"
    f" status = CASE WHEN cancel_requested THEN '{CANCELLED}'"
    f" WHEN {_OVER} THEN '{JobStatus.FAILED.value}' ELSE '{QUEUED}' END,"
    f" finished_at = CASE WHEN cancel_requested OR {_OVER} THEN %(now)s ELSE NULL END,"
    f" next_run_at = CASE WHEN cancel_requested OR {_OVER} THEN next_run_at ELSE %(run_at)s END,"
    f" fair_at = CASE WHEN cancel_requested OR {_OVER} THEN fair_at ELSE %(run_at_place)s END,"
    f" error = CASE WHEN cancel_requested THEN '' WHEN {_OVER} THEN %(failed)s"
    " ELSE %(waiting)s END,"
    " handler_unknown_since = COALESCE(handler_unknown_since, %(now)s),"
    " attempt_count = attempt_count - 1, limit_keys = NULL, updated_at = %(now)s,"
    f" {LEAVE_RUNNING},"
    " started_at = NULL, progress = NULL, progress_message = '', result_ref = NULL"
    f" WHERE current_token = %(token)s AND status = '{RUNNING}'"
    f" RETURNING {', '.join(ENDING_COLUMNS)}, {_COUNTED_BEFORE}"
)


# --------------------------------------------------------------------------- expiry

EXPIRED = JobStatus.EXPIRED.value


@functools.lru_cache(maxsize=4)
def expire_jobs(vendor: str) -> str:
    """End up to ``limit`` Queued jobs whose start deadline is at or before ``now``
    Expired, the earliest deadlines first, with ``error``; no attempt is used. On
    PostgreSQL, jobs another transaction holds (a claim, a cancel) are skipped: the
    next sweep finds them if they are still Queued. Returns each expired job's
    :data:`jobs.store.sql_endings.ENDING_COLUMNS` (what its batch and sequence need)."""
    due = f"status = '{QUEUED}' AND start_by IS NOT NULL AND start_by <= %(now)s"
    which = id_among_locked(
        vendor, f"SELECT id FROM {JOB} WHERE {due} ORDER BY start_by LIMIT %(limit)s"
    )
    return (
        f"UPDATE {JOB} SET status = '{EXPIRED}', finished_at = %(now)s, updated_at = %(now)s,"
        f" error = %(error)s WHERE {which} AND {due} RETURNING {', '.join(ENDING_COLUMNS)}"
    )
