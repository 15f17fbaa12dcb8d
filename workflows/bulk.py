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
from .store import carrying, many


def matching(selection: BulkFilter) -> QuerySet[WorkflowRun]:
    """The runs ``selection`` matches: ``name`` is the workflow's name, ``scope`` is
    hashed as :class:`~workflows.WorkflowScope` hashes it, the time window is on the
    creation time, ``error_contains`` ignores case (ASCII letters only, on SQLite),
    and ``tags`` are checked and matched as :meth:`WorkflowScope.list
    <workflows.WorkflowScope.list>` checks and matches them (a run matches when it
    carries every pair): bad ones are :class:`~workflows.exceptions.InvalidInput`."""
    runs = WorkflowRun.objects.all()
    if selection.scope is not None:
        runs = runs.for_scope(validation.scope_hash(selection.scope))
    rows = selection.narrow(runs, name_field="name")
    if selection.tags is None:
        return rows
    return carrying(rows, validation.tags(dict(selection.tags)))


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
