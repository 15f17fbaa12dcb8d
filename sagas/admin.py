"""Read-only inspection of saga instances in the Django admin.

Nothing is editable by hand: no form saves an instance, and nothing can be added or
deleted here. The only state changes are the "Resume" and "Compensate" actions, which
drive instances through the runner (:func:`sagas.api.resume_saga`,
:func:`sagas.api.compensate_saga`) in the admin's own process, and are offered only to
users holding ``sagas.change_sagainstance`` (the admin never edits an instance, so that
permission means "may steer sagas"). Staff with only the view permission see the pages
and no actions.

Chosen with "Select all N", the two actions act on every instance the filters and
search match, after a confirmation page with the dry run's counts, and only hand the
instances to the saga runners (:mod:`sagas.bulk`): a request does not drive thousands
of sagas.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db import DatabaseError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ledon.admin import (
    MAX_LISTED,
    GrowingTableMixin,
    ReadOnlyModelAdmin,
    fieldset_fields,
    indented_json,
    state_action,
)
from ledon.bulk_admin import BulkAdminMixin, selected_across

from . import bulk
from .api import compensate_saga, resume_saga
from .exceptions import InvalidInput, SagaError, UnknownSaga
from .models import SagaInstance
from .registry import get_saga
from .types import SagaSnapshot, SagaStatus


def _step_state(obj: SagaInstance, name: str) -> str:
    if name in obj.compensated_steps:
        return "compensated"
    if name in obj.uncompensated_steps:
        return "completed, no compensation (effects remain)"
    if name in obj.completed_steps:
        return "completed"
    if name == obj.failed_step:
        return "failed"
    return "pending"


@admin.register(SagaInstance)
class SagaInstanceAdmin(BulkAdminMixin, GrowingTableMixin, ReadOnlyModelAdmin[SagaInstance]):
    list_display = (
        "instance_id",
        "name",
        "status",
        "progress",
        "failed_step",
        "leased_by",
        "leased_until",
        "updated_at",
    )
    list_filter = ("status", "name")
    search_fields = ("=instance_id", "=idempotency_key", "name")
    search_help_text = "Instance id or idempotency key (exact), or saga name (contains)."
    ordering = ("-created_at", "-id")
    actions = ("resume_instances", "compensate_instances")
    bulk_error = InvalidInput
    bulk_errors = (SagaError,)
    fieldsets = (
        (
            None,
            {"fields": ("instance_id", "name", "idempotency_key", "status", "version")},
        ),
        ("Steps", {"fields": ("steps_table",)}),
        ("Data", {"fields": ("data_pretty",)}),
        ("Failure", {"fields": ("failed_step", "error", "compensation_error")}),
        ("Lease", {"fields": ("leased_by", "leased_until", "takeovers")}),
        ("Times", {"fields": ("created_at", "updated_at", "finished_at")}),
    )
    readonly_fields = fieldset_fields(fieldsets)

    # ------------------------------------------------------------------ columns

    @admin.display(description="steps done")
    def progress(self, obj: SagaInstance) -> str:
        done = f"{len(obj.completed_steps)}/{len(obj.steps)}"
        if obj.compensated_steps or obj.uncompensated_steps:
            undone = len(obj.compensated_steps) + len(obj.uncompensated_steps)
            done += f", {undone} undone"
        return done

    @admin.display(description="steps")
    def steps_table(self, obj: SagaInstance) -> SafeString:
        try:
            definition = get_saga(obj.name)
        except UnknownSaga:
            definition = None
        rows = []
        for index, name in enumerate(obj.steps, 1):
            compensation = "-"
            if definition is not None and name in definition.step_names:
                compensation = "yes" if definition.get_step(name).compensate else "none"
            elif definition is None:
                compensation = "? (saga not registered here)"
            rows.append((index, name, _step_state(obj, name), compensation))
        body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows)
        return format_html(
            '<table class="sagas-steps"><thead><tr><th>#</th><th>step</th><th>state</th>'
            "<th>compensation</th></tr></thead><tbody>{}</tbody></table>",
            body,
        )

    @admin.display(description="data")
    def data_pretty(self, obj: SagaInstance) -> SafeString:
        return format_html('<pre class="sagas-data">{}</pre>', indented_json(obj.data))

    # ------------------------------------------------------------------ actions

    @state_action("Resume selected instances (drive them here)")
    def resume_instances(
        self, request: HttpRequest, queryset: QuerySet[SagaInstance]
    ) -> HttpResponse | None:
        """Claim running or compensating instances whose lease expired and drive them;
        with "Select all N", hand every matching one back to the runners instead."""
        if selected_across(request):
            return self.bulk_by_filter(
                request,
                queryset,
                "resume_instances",
                bulk.resume_action,
                explain="Running and compensating instances whose runner is gone (lease "
                "expired, or taken over before) are released for the saga runners "
                "(recover_sagas, or the one beside each run_jobs worker) to drive, their "
                "takeovers counted from zero. Nothing is driven in this request.",
            )
        self._steer(request, queryset, resume_saga, "resumed")
        return None

    @state_action("Compensate selected instances (undo their completed steps)")
    def compensate_instances(
        self, request: HttpRequest, queryset: QuerySet[SagaInstance]
    ) -> HttpResponse | None:
        """Undo completed steps; for failed instances, try the compensations again;
        with "Select all N", hand every matching one to the runners to compensate."""
        reason = f"compensation requested in the admin by {request.user}"
        if selected_across(request):
            return self.bulk_by_filter(
                request,
                queryset,
                "compensate_instances",
                lambda: bulk.compensate_action(reason),
                explain="Running instances no runner holds start compensating; failed "
                "ones (a compensation kept failing) try their compensations again. The "
                "saga runners (recover_sagas, or the one beside each run_jobs worker) "
                "undo their completed steps; nothing is driven in this request.",
            )

        def compensate(instance_id: Any, *, runner_id: str) -> SagaSnapshot:
            return compensate_saga(instance_id, reason=reason, runner_id=runner_id)

        self._steer(request, queryset, compensate, "compensated")
        return None

    def _steer(
        self,
        request: HttpRequest,
        queryset: QuerySet[SagaInstance],
        call: Callable[..., SagaSnapshot],
        verb: str,
    ) -> None:
        runner_id = f"admin:{request.user}"[:200]
        done: list[SagaSnapshot] = []
        refusals: list[str] = []
        for instance_id in queryset.values_list("instance_id", flat=True):
            try:
                done.append(call(instance_id, runner_id=runner_id))
            except (SagaError, DatabaseError) as exc:
                refusals.append(f"{instance_id}: {exc}")
        for state in done[:MAX_LISTED]:
            level = messages.SUCCESS
            if state.status is SagaStatus.FAILED:
                level = messages.ERROR
            elif state.status is SagaStatus.COMPENSATED and verb == "resumed":
                level = messages.WARNING
            detail = f" (step {state.failed_step!r} failed)" if state.failed_step else ""
            self.message_user(
                # Not the bare id first: the admin capitalises a message's first letter.
                request,
                f"Instance {state.instance_id}: {state.status.label.lower()}{detail}.",
                level,
            )
        if len(done) > MAX_LISTED:
            self.message_user(request, f"... and {len(done) - MAX_LISTED} more {verb}.")
        for reason in refusals[:MAX_LISTED]:
            self.message_user(request, f"Not {verb}: {reason}", messages.WARNING)
        if len(refusals) > MAX_LISTED:
            self.message_user(
                request, f"... and {len(refusals) - MAX_LISTED} more not {verb}.", messages.WARNING
            )
