"""Compensate and resume by filter: every saga instance the admin's filters match, not
only those ticked on one page (the admin's "all N matching" actions).

Unlike the actions on ticked instances, which drive each one to its end in the admin's
own process, these only hand the instances to the saga runners (``recover_sagas``, or
the runner beside each ``run_jobs`` worker), through the store's set-based transitions
(:func:`sagas.store.compensate_many`, :func:`~sagas.store.resume_many`): a request
must not drive thousands of sagas.
"""

from __future__ import annotations

from ledon.bulk import BulkAction

from . import store


def compensate_action(reason: str = "") -> BulkAction:
    """Compensate: Running instances no runner holds start compensating, Failed ones
    try their compensations again; ``reason`` is recorded as a Running one's error."""
    return BulkAction(
        verb="compensate",
        outcomes=(store.COMPENSATION_STARTED, store.COMPENSATION_RETRIED),
        preview=lambda rows: store.compensate_preview(rows),
        apply=lambda ids: store.compensate_many(ids, reason=reason),
    )


def resume_action() -> BulkAction:
    """Resume: Running and Compensating instances whose runner is gone are handed back
    to the runners, their takeovers counted from zero."""
    return BulkAction(
        verb="resume",
        outcomes=(store.HANDED_TO_RUNNERS,),
        preview=lambda rows: store.resume_preview(rows),
        apply=lambda ids: store.resume_many(ids),
    )
