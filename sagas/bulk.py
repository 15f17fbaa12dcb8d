"""Compensate and resume by filter: every saga instance a filter matches, not only those
ticked on one admin page — ``manage.py bulk_sagas`` and the admin's "all N matching"
actions.

Unlike the actions on ticked instances, which drive each one to its end in the admin's
own process, these only hand the instances to the saga runners (``recover_sagas``, or
the runner beside each ``run_jobs`` worker), through the store's set-based transitions
(:func:`sagas.store.compensate_many`, :func:`~sagas.store.resume_many`): a request
must not drive thousands of sagas.
"""

from __future__ import annotations

from django.db.models import QuerySet

from ledon.bulk import BulkAction, BulkFilter
from ledon.errors import MAX_ERROR_LENGTH
from ledon.validation import text

from . import store
from .exceptions import InvalidInput
from .models import SagaInstance


def matching(selection: BulkFilter) -> QuerySet[SagaInstance]:
    """The instances ``selection`` matches: ``name`` is the saga's name, the time
    window is on the creation time, and ``error_contains`` is looked for, in any case
    (ASCII letters only, on SQLite), in the error of the step that failed and in the
    error of the compensation that kept failing. Instances belong to no scope and
    carry no tags: a filter with either is :class:`~sagas.exceptions.InvalidInput`."""
    if selection.scope is not None or selection.tags is not None:
        raise InvalidInput("saga instances belong to no scope and carry no tags")
    return selection.narrow(
        SagaInstance.objects.all(), name_field="name", error_fields=("error", "compensation_error")
    )


def compensate_action(reason: str = "") -> BulkAction:
    """Compensate: Running instances no runner holds start compensating, Failed ones
    try their compensations again; ``reason`` is recorded as a Running one's error
    (empty: "compensation requested by an operator"). A ``reason`` that is not a text
    an error may hold (at most :data:`~ledon.errors.MAX_ERROR_LENGTH` characters, no
    NUL, valid Unicode) raises :class:`~sagas.exceptions.InvalidInput` here, before
    anything runs."""
    reason = text(
        reason, "reason", max_length=MAX_ERROR_LENGTH, error=InvalidInput, empty=True, control=True
    )
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
