"""Cancel and resume by filter: every run a filter matches, not only those ticked on
one admin page — ``manage.py bulk_workflows`` and the admin's "all N matching"
actions.

:func:`matching` turns a command's filter into runs; :func:`cancel_action` and
:func:`resume_action` are the operations :func:`ledon.bulk.run_bulk` applies to them,
batch after batch, through the store's set-based transitions
(:func:`workflows.store.cancel_runs_many`, :func:`~workflows.store.resume_runs_many`):
the rules of one run's cancel and resume, a few statements per batch.
"""

from __future__ import annotations

from django.db.models import QuerySet

from ledon.bulk import BulkAction, BulkFilter

from . import validation
from .models import WorkflowRun
from .store import many


def matching(selection: BulkFilter) -> QuerySet[WorkflowRun]:
    """The runs ``selection`` matches: ``name`` is the workflow's name, ``scope`` is
    hashed as :class:`~workflows.WorkflowScope` hashes it, the time window is on the
    creation time and ``error_contains`` ignores case (ASCII letters only, on
    SQLite)."""
    rows = WorkflowRun.objects.all()
    if selection.status is not None:
        rows = rows.filter(status=selection.status)
    if selection.name is not None:
        rows = rows.filter(name=selection.name)
    if selection.scope is not None:
        rows = rows.for_scope(validation.scope_hash(selection.scope))
    return selection.created_and_erring(rows)


def cancel_action() -> BulkAction:
    """Cancel: Waiting runs end Cancelled at once, Running ones are asked to stop,
    finished ones are left; the unfinished children and running items of each are
    cancelled with it."""
    return BulkAction(
        verb="cancel",
        outcomes=(many.CANCELLED, many.CANCEL_REQUESTED),
        preview=many.cancel_preview,
        apply=lambda ids: many.cancel_runs_many(ids),
    )


def resume_action() -> BulkAction:
    """Resume: Failed runs are replayed again, their failed checkpoints run again with
    fresh retries; the others are left."""
    return BulkAction(
        verb="resume",
        outcomes=(many.RESUMED,),
        preview=many.resume_preview,
        apply=lambda ids: many.resume_runs_many(ids),
    )
