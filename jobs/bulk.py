"""Cancel and retry by filter: every job a filter matches, not only those ticked on one
admin page — ``manage.py bulk_jobs`` and the admin's "all N matching" actions.

:func:`matching` turns a command's filter into jobs; :func:`cancel_action` and
:func:`retry_action` are the operations :func:`ledon.bulk.run_bulk` applies to them,
batch after batch, through the store's set-based transitions
(:func:`jobs.store.scoped.cancel_many`, :func:`~jobs.store.scoped.retry_many`) — the
rules of one job's cancel and retry, one guarded statement per rule and batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import QuerySet

from ledon.bulk import BatchOutcome, BulkAction, BulkFilter

from . import validation
from .exceptions import InvalidInput
from .handlers import library_handlers
from .models import Job
from .store import scoped


def matching(selection: BulkFilter) -> QuerySet[Job]:
    """The jobs ``selection`` matches: ``name`` is the handler, ``scope`` is hashed as
    :class:`~jobs.JobScope` hashes it, the time window is on the creation time and
    ``error_contains`` ignores case (ASCII letters only, on SQLite). As in the admin,
    the library's own jobs (``@job_handler(library=True)``: the workflow engine's
    advances) are left out unless ``name`` names one. Jobs carry no tags: a filter
    with tags is :class:`~jobs.exceptions.InvalidInput`."""
    if selection.tags is not None:
        raise InvalidInput("jobs carry no tags: a filter by tags selects workflow runs")
    rows = selection.narrow(Job.objects.all(), name_field="handler")
    if selection.name is None:
        rows = rows.exclude(handler__in=sorted(library_handlers()))
    if selection.scope is not None:
        rows = rows.filter(scope_hash=validation.scope_hash(selection.scope))
    return rows


def cancel_action() -> BulkAction:
    """Cancel: Queued jobs end Cancelled at once, Running ones are asked to stop,
    finished ones are left."""
    return BulkAction(
        verb="cancel",
        outcomes=(scoped.CANCELLED, scoped.CANCEL_REQUESTED),
        preview=scoped.cancel_preview,
        apply=lambda ids: scoped.cancel_many(ids),
    )


def retry_action(extra_attempts: int = 0) -> BulkAction:
    """Retry, granting each job ``extra_attempts`` as :meth:`jobs.JobScope.retry` does:
    Failed, Cancelled and Interrupted jobs with an attempt left (once granted) are
    queued again. A bad ``extra_attempts`` raises
    :class:`~jobs.exceptions.InvalidSubmission` here, before anything runs."""
    extra = validation.integer(extra_attempts, "extra_attempts", 0, validation.MAX_ATTEMPTS_LIMIT)

    def apply(ids: Sequence[int]) -> BatchOutcome:
        return scoped.retry_many(ids, extra_attempts=extra)

    return BulkAction(
        verb="retry",
        outcomes=(scoped.REQUEUED,),
        preview=lambda rows: scoped.retry_preview(rows, extra_attempts=extra),
        apply=apply,
    )
