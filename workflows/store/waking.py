"""Waking runs: the advance jobs that take a run forward, staged in the transaction
of the change that wakes it, under ids that make one job of racing writers."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jobs import store as job_store
from jobs import validation as job_validation
from jobs.types import JobSubmission

from ..conf import workflows_settings
from ..exceptions import UntrustedJob
from ..models import WorkflowRun

#: The job handler that advances runs (registered by :mod:`workflows.handlers`).
ADVANCE_HANDLER = "workflows.advance"


#: Tries of an advance job: only database outages and kills fail one; the body's
#: own errors are recorded on the run, never raised to the job.
ADVANCE_MAX_ATTEMPTS = 25


#: The reserved scope of the advance jobs (see :func:`advance_scope_hash`).
ADVANCE_SCOPE = "workflows"


#: The prefix of every advance job's id: ``wf:{run}.{generation}:{reason}``.
ADVANCE_JOB_PREFIX = "wf:"


def advance_scope_hash() -> str:
    """The scope of the jobs that advance runs: the reserved scope "workflows".

    The one place that chooses it. A reserved scope hashes in a namespace of its own,
    so ``JobScope("workflows")`` is a tenant that can never see, cancel or retry these
    jobs; trusted code reaches them with ``execution.reserved_scope("workflows")``.
    """
    return job_validation.reserved_scope_hash(ADVANCE_SCOPE)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def advance_job_prefix(run_pk: int) -> str:
    """The start of the id of every advance job of run ``run_pk`` (see :func:`wake`)."""
    return f"{ADVANCE_JOB_PREFIX}{run_pk}."


def wake(
    run_pk: int,
    generation: int,
    reason: str,
    detail: str = "",
    *,
    not_before: datetime | None = None,
    now: datetime | None = None,
) -> None:
    """Stage the advance job that wakes run ``run_pk`` for ``reason`` (inside the
    caller's transaction: it exists if and only if the change that wakes the run
    commits). The same reason and detail make the same job: exactly one however
    many writers race."""
    job_store.stage(*_advance(run_pk, generation, reason, detail, not_before), now=now)


def wake_many(runs: Sequence[tuple[int, int]], reason: str, *, now: datetime | None = None) -> None:
    """:func:`wake` for each (run, generation) of ``runs``, for one ``reason``: one
    bulk insert of their advance jobs, inside the caller's transaction."""
    if runs:
        job_store.stage_many([_advance(pk, generation, reason) for pk, generation in runs], now=now)


def advance_job(
    run_pk: int, generation: int, reason: str, detail: str = ""
) -> tuple[str, str, JobSubmission]:
    """The scope, id and submission of the advance job :func:`wake` would stage for run
    ``run_pk`` of ``generation``, ``reason`` and ``detail``, for a caller that has it
    inserted otherwise (a map's items' jobs batch, as its ``then`` job)."""
    return _advance(run_pk, generation, reason, detail)


def _advance(
    run_pk: int,
    generation: int,
    reason: str,
    detail: str = "",
    not_before: datetime | None = None,
) -> tuple[str, str, JobSubmission]:
    """The scope, id and submission of the advance job that wakes run ``run_pk`` of
    ``generation`` for ``reason`` (and ``detail``)."""
    job_id = f"{advance_job_prefix(run_pk)}{generation}:{reason}"
    if detail:
        job_id += f":{_digest(detail)}"
    sub = JobSubmission.create(
        ADVANCE_HANDLER,
        {"run": run_pk},
        queue=workflows_settings().ADVANCE_QUEUE,
        max_attempts=ADVANCE_MAX_ATTEMPTS,
        not_before=not_before,
    )
    return advance_scope_hash(), job_id, sub


def staged_advance(scope_hash: str, job_id: str, payload: Any) -> int:
    """The run an advance job may advance: the one :func:`wake` staged it for.

    Its id is predictable (it must be: racing writers make one job of it), so it is
    no capability; the reserved scope is, which no tenant reaches. A job of another
    scope, or whose id is not one of its run's advance ids, is :class:`UntrustedJob`:
    it advances nothing and releases nothing."""
    run_pk = payload.get("run") if isinstance(payload, dict) else None
    if (
        scope_hash != advance_scope_hash()
        or not isinstance(run_pk, int)
        or isinstance(run_pk, bool)
        or not job_id.startswith(advance_job_prefix(run_pk))
    ):
        raise UntrustedJob(
            f"job {job_id!r} is no advance job the workflow engine staged: it advances "
            "no run (the engine's own handlers run only the jobs it staged)"
        )
    return run_pk


def drop_wakes(run_pks: list[int], now: datetime) -> int:
    """Cancel the Queued advance jobs of runs ``run_pks`` (a timer, a signal's
    timeout, a retry's wake-up), which finished or are purged: one guarded statement,
    in the caller's transaction, so that no wake-up of a finished run stays Queued."""
    prefixes = [advance_job_prefix(pk) for pk in run_pks]
    return job_store.cancel_queued(advance_scope_hash(), prefixes, now=now)


def wake_parent(parent_pk: int | None, child_key: str, now: datetime) -> None:
    """Wake run ``parent_pk`` (if any: a top-level run has none) for its child
    ``child_key``, which has just ended."""
    if parent_pk is None:
        return
    generation = (
        WorkflowRun.objects.filter(pk=parent_pk).values_list("generation", flat=True).first()
    )
    if generation is not None:
        wake(parent_pk, generation, "child", child_key, now=now)
