"""Read-only inspection of workflow runs in the Django admin, with the picture of each
run (:mod:`workflows.picture`).

Nothing is editable by hand. The only state changes are the "Cancel" and "Resume"
actions, which go through the store (:func:`workflows.store.cancel`,
:func:`workflows.store.resume`) and are offered only to users holding
``workflows.change_workflowrun`` (the admin never edits a run, so that permission
means "may steer runs"). Staff with only the view permission see the pages and the
picture, and no actions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db import DatabaseError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from ledon.admin import (
    GrowingTableMixin,
    ReadOnlyModelAdmin,
    fieldset_fields,
    indented_json,
    report_changes,
    state_action,
)

from . import store
from .exceptions import WorkflowError
from .models import WorkflowRun
from .picture import GEOMETRY, layout
from .types import RunStatus


def pretty_json(text: str | None) -> SafeString:
    """JSON text indented in a ``<pre>`` (escaped), or a dash when there is none."""
    if text is None or text == "":
        return format_html("{}", "-")
    return format_html('<pre class="workflows-json">{}</pre>', indented_json(text))


@admin.register(WorkflowRun)
class WorkflowRunAdmin(GrowingTableMixin, ReadOnlyModelAdmin[WorkflowRun]):
    list_display = (
        "run_id",
        "name",
        "version",
        "status",
        "waiting_for",
        "failed_step",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "wait_kind", "name", "version")
    search_fields = ("=run_id",)
    search_help_text = "Run id (exact)."
    ordering = ("-created_at", "-id")
    actions = ("cancel_runs", "resume_runs")
    fieldsets = (
        (None, {"fields": ("run_id", "name", "version", "status", "waiting_for", "parent_link")}),
        ("Picture", {"fields": ("picture",)}),
        ("Input and output", {"fields": ("input_pretty", "output_pretty")}),
        ("Failure", {"fields": ("failed_step", "error_pretty")}),
        ("Checkpoints", {"fields": ("steps_table",)}),
        (
            "Times",
            {"fields": ("created_at", "updated_at", "finished_at", "wake_at", "advances")},
        ),
        ("Identity", {"fields": ("scope_hash", "generation", "cancel_requested")}),
    )
    readonly_fields = fieldset_fields(fieldsets)

    # ------------------------------------------------------------------ the page

    def _child_link(self, scope_hash: str) -> Callable[[str], str]:
        def link(run_id: str) -> str:
            pk = (
                WorkflowRun.objects.for_scope(scope_hash)
                .filter(run_id=run_id)
                .values_list("pk", flat=True)
                .first()
            )
            return "" if pk is None else reverse("admin:workflows_workflowrun_change", args=[pk])

        return link

    @admin.display(description="waiting for")
    def waiting_for(self, obj: WorkflowRun) -> str:
        """What the run waits for, from its data (a map's key, not its counts: the
        list reads no items)."""
        wait = store.wait_of(obj)
        return wait.describe() if wait is not None else ""

    @admin.display(description="picture")
    def picture(self, obj: WorkflowRun) -> SafeString:
        drawn = layout(
            store.snapshot(obj), now=timezone.now(), child_link=self._child_link(obj.scope_hash)
        )
        # The template escapes every value it draws.
        return mark_safe(
            render_to_string("admin/workflows/picture.html", {"picture": drawn, "g": GEOMETRY})
        )

    @admin.display(description="parent run")
    def parent_link(self, obj: WorkflowRun) -> SafeString:
        if obj.parent_id is None:
            return format_html("{}", "-")
        parent = WorkflowRun.objects.filter(pk=obj.parent_id).only("run_id").first()
        label = parent.run_id if parent is not None else str(obj.parent_id)
        url = reverse("admin:workflows_workflowrun_change", args=[obj.parent_id])
        return format_html('<a href="{}">{}</a> (step {})', url, label, obj.parent_key or "?")

    @admin.display(description="input")
    def input_pretty(self, obj: WorkflowRun) -> SafeString:
        return pretty_json(obj.input_json)

    @admin.display(description="output")
    def output_pretty(self, obj: WorkflowRun) -> SafeString:
        return pretty_json(obj.output_json)

    @admin.display(description="error")
    def error_pretty(self, obj: WorkflowRun) -> SafeString:
        return format_html('<pre class="workflows-error">{}</pre>', obj.error or "-")

    @admin.display(description="checkpoints")
    def steps_table(self, obj: WorkflowRun) -> SafeString:
        rows = []
        for step in store.snapshot(obj).steps:
            result = json.dumps(step.result, indent=2, ensure_ascii=False, sort_keys=True)
            rows.append(
                format_html(
                    "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td>"
                    "<td>{}</td><td>{}</td><td><details><summary>result</summary>"
                    "<pre>{}</pre></details>{}</td></tr>",
                    step.key,
                    step.kind.label,
                    step.status.label,
                    step.attempts,
                    step.started_at.strftime("%Y-%m-%d %H:%M:%S"),
                    step.finished_at.strftime("%Y-%m-%d %H:%M:%S") if step.finished_at else "-",
                    result,
                    format_html('<pre class="workflows-error">{}</pre>', step.error)
                    if step.error
                    else "",
                )
            )
        return format_html(
            '<table class="workflows-steps"><thead><tr><th>key</th><th>kind</th>'
            "<th>status</th><th>tries</th><th>started</th><th>finished</th><th>value</th>"
            "</tr></thead><tbody>{}</tbody></table>",
            mark_safe("".join(rows)),
        )

    # ------------------------------------------------------------------ actions

    @state_action("Cancel selected runs (and their unfinished children)")
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        """Waiting runs end Cancelled at once; running ones at their next checkpoint."""
        self._steer(
            request,
            queryset,
            lambda run: str(store.cancel(run.scope_hash, run.run_id)),
            "cancelled",
        )

    @state_action("Resume selected failed runs (the failed step runs again)")
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        """A Failed run advances again: recorded checkpoints keep their values."""

        def resume(run: WorkflowRun) -> str:
            if run.status != RunStatus.FAILED:
                raise WorkflowError(f"it is {RunStatus(run.status).label.lower()}, not failed")
            return str(store.resume(run.scope_hash, run.run_id).status)

        self._steer(request, queryset, resume, "resumed")

    def _steer(
        self,
        request: HttpRequest,
        queryset: QuerySet[WorkflowRun],
        call: Callable[[WorkflowRun], Any],
        verb: str,
    ) -> None:
        changed = 0
        refusals: list[str] = []
        for run in queryset.only("pk", "scope_hash", "run_id", "status"):
            try:
                outcome = call(run)
            except (WorkflowError, DatabaseError) as exc:
                refusals.append(f"run {run.run_id}: {exc}")
                continue
            if outcome == "already_finished":
                refusals.append(f"run {run.run_id}: it had finished already")
            else:
                changed += 1
        report_changes(self, request, changed, verb, refusals)
        if not changed and not refusals:
            self.message_user(request, "Nothing selected.", messages.WARNING)
