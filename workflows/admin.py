"""Read-only inspection of workflow runs in the Django admin, with the picture of each
run (:mod:`workflows.picture`).

Nothing is editable by hand. The only state changes are the "Cancel" and "Resume"
actions, which go through the store (:func:`workflows.store.cancel`,
:func:`workflows.store.resume`), and "fork from this step" on a run's page (a form
that calls :func:`workflows.api.fork_run`); they are offered only to users holding
``workflows.change_workflowrun`` (the admin never edits a run, so that permission
means "may steer runs"). Staff with only the view permission see the pages and the
picture, and no actions. With "Select all N", either action acts on every run the
filters and search match, by filter (:mod:`workflows.bulk`), after a confirmation
page with its dry run (:mod:`ledon.bulk_admin`).

The search box takes a run id (exactly) or tags: ``customer=42`` finds the runs
carrying that pair, ``customer=42, region=eu`` those carrying both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
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
from ledon.bulk_admin import BulkAdminMixin, selected_across

from . import bulk, store, validation
from .api import fork_run
from .exceptions import InvalidInput, WorkflowError
from .models import WorkflowRun
from .picture import GEOMETRY, layout
from .types import RunStatus


def pretty_json(text: str | None) -> SafeString:
    """JSON text indented in a ``<pre>`` (escaped), or a dash when there is none."""
    if text is None or text == "":
        return format_html("{}", "-")
    return format_html('<pre class="workflows-json">{}</pre>', indented_json(text))


#: Whether the user of the page being drawn may steer runs (the checkpoints table
#: offers "fork from this step" only then).
_may_steer: ContextVar[bool] = ContextVar("workflows_admin_may_steer", default=False)


class ForkForm(forms.Form):
    """A fork of a run from one of its checkpoints."""

    from_step = forms.CharField(
        max_length=200, strip=False, help_text="The checkpoint the new run goes on from."
    )
    new_run_id = forms.CharField(
        max_length=1000, strip=False, help_text="The new run's id, in the same scope."
    )
    version = forms.IntegerField(
        required=False, min_value=1, help_text="Empty: the version of the run forked."
    )


def tag_search(term: str) -> dict[str, str] | None:
    """The tags a search term asks for (``customer=42, region=eu``), or None if it is
    not pairs of tags (then it is a run id)."""
    pairs = [part.partition("=") for part in term.split(",")]
    if not term.strip() or any(not sep for _, sep, _ in pairs):
        return None
    try:
        return validation.tags({key.strip(): value.strip() for key, _, value in pairs})
    except InvalidInput:
        return None


@admin.register(WorkflowRun)
class WorkflowRunAdmin(BulkAdminMixin, GrowingTableMixin, ReadOnlyModelAdmin[WorkflowRun]):
    list_display = (
        "run_id",
        "name",
        "version",
        "status",
        "waiting_for",
        "failed_step",
        "tags_text",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "wait_kind", "name", "version")
    search_fields = ("=run_id",)
    search_help_text = "Run id (exact), or tags: customer=42 (several: customer=42, region=eu)."
    bulk_error = InvalidInput
    bulk_errors = (WorkflowError,)
    ordering = ("-created_at", "-id")
    actions = ("cancel_runs", "resume_runs")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "run_id",
                    "name",
                    "version",
                    "status",
                    "waiting_for",
                    "parent_link",
                    "tags_text",
                )
            },
        ),
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

    # ------------------------------------------------------------------ search

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[WorkflowRun], bool]:
        """Run ids exactly; ``key=value`` pairs (comma-separated): the runs carrying
        every pair."""
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        tags = tag_search(search_term)
        if tags is None:
            return found, may_have_duplicates
        tagged = store.carrying(queryset, tags).values("pk")
        return found | queryset.filter(pk__in=tagged), may_have_duplicates

    # ------------------------------------------------------------------ the page

    @admin.display(description="tags")
    def tags_text(self, obj: WorkflowRun) -> str:
        return ", ".join(f"{key}={value}" for key, value in sorted(obj.tags.items()))

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

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        token = _may_steer.set(self.has_steer_permission(request))
        try:
            response = super().change_view(request, object_id, form_url, extra_context)
            if isinstance(response, TemplateResponse):
                response.render()  # the readonly fields read the flag as they render
            return response
        finally:
            _may_steer.reset(token)

    def _fork_link(self, obj: WorkflowRun, key: str) -> SafeString:
        if not _may_steer.get() or obj.status == RunStatus.RUNNING:
            return mark_safe("")
        url = reverse("admin:workflows_workflowrun_fork", args=[obj.pk])
        return format_html(
            '<a href="{}?{}">fork from this step</a>', url, urlencode({"from_step": key})
        )

    @admin.display(description="checkpoints")
    def steps_table(self, obj: WorkflowRun) -> SafeString:
        rows = []
        for step in store.snapshot(obj).steps:
            result = json.dumps(step.result, indent=2, ensure_ascii=False, sort_keys=True)
            rows.append(
                format_html(
                    "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td>"
                    "<td>{}</td><td>{}</td><td><details><summary>result</summary>"
                    "<pre>{}</pre></details>{}</td><td>{}</td></tr>",
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
                    self._fork_link(obj, step.key),
                )
            )
        return format_html(
            '<table class="workflows-steps"><thead><tr><th>key</th><th>kind</th>'
            "<th>status</th><th>tries</th><th>started</th><th>finished</th><th>value</th>"
            "<th></th></tr></thead><tbody>{}</tbody></table>",
            mark_safe("".join(rows)),
        )

    # ------------------------------------------------------------------ fork

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "<int:object_id>/fork/",
                self.admin_site.admin_view(self.fork_view),
                name="workflows_workflowrun_fork",
            )
        ]
        return own + super().get_urls()

    def fork_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """Fork a run from one of its checkpoints (GET: the form, the step from the
        link; POST: the fork, then the new run's page)."""
        if not self.has_steer_permission(request):
            raise PermissionDenied
        run = get_object_or_404(WorkflowRun, pk=object_id)
        initial = {
            "from_step": request.GET.get("from_step", ""),
            "new_run_id": f"{run.run_id}-fork",
        }
        form = ForkForm(request.POST or None, initial=initial)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                forked = fork_run(
                    run.scope_hash,
                    run.run_id,
                    data["new_run_id"],
                    data["from_step"],
                    data["version"],
                )
            except (WorkflowError, DatabaseError) as exc:
                form.add_error(None, str(exc))
            else:
                pk = (
                    WorkflowRun.objects.for_scope(run.scope_hash)
                    .filter(run_id=forked.run_id)
                    .values_list("pk", flat=True)
                    .get()
                )
                self.message_user(
                    request,
                    f"Run {forked.run_id} forked from run {run.run_id} at step "
                    f"{data['from_step']!r} ({len(forked.steps)} checkpoint(s) copied).",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(
                    reverse("admin:workflows_workflowrun_change", args=[pk])
                )
        context = {
            **self.admin_site.each_context(request),
            "title": f"Fork run {run.run_id}",
            "opts": self.opts,
            "run": run,
            "form": form,
        }
        return TemplateResponse(request, "admin/workflows/workflowrun/fork.html", context)

    # ------------------------------------------------------------------ actions

    @state_action("Cancel selected runs (and their unfinished children)")
    def cancel_runs(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun]
    ) -> HttpResponse | None:
        """Waiting runs end Cancelled at once; running ones at their next checkpoint;
        with "Select all N", every matching run, by filter, once confirmed."""
        if selected_across(request):
            return self.bulk_by_filter(
                request,
                queryset,
                "cancel_runs",
                bulk.cancel_action,
                explain="Waiting runs end Cancelled at once; running ones are asked to "
                "stop and end Cancelled at their next checkpoint. Their unfinished "
                "children and running items are cancelled with them; finished runs are "
                "left. Each batch is a short transaction that skips the runs a worker "
                "holds at that moment, and tries them again after the pass.",
            )
        self._steer(
            request,
            queryset,
            lambda run: str(store.cancel(run.scope_hash, run.run_id)),
            "cancelled",
        )
        return None

    @state_action("Resume selected failed runs (the failed step runs again)")
    def resume_runs(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun]
    ) -> HttpResponse | None:
        """A Failed run advances again: recorded checkpoints keep their values; with
        "Select all N", every matching failed run, by filter, once confirmed."""
        if selected_across(request):
            return self.bulk_by_filter(
                request,
                queryset,
                "resume_runs",
                bulk.resume_action,
                explain="Failed runs advance again: their failed steps run again with "
                "fresh retries, recorded steps keep their values. The workers advance "
                "them; nothing is run in this request. Runs that are not failed are "
                "left.",
            )

        def resume(run: WorkflowRun) -> str:
            if run.status != RunStatus.FAILED:
                raise WorkflowError(f"it is {RunStatus(run.status).label.lower()}, not failed")
            return str(store.resume(run.scope_hash, run.run_id).status)

        self._steer(request, queryset, resume, "resumed")
        return None

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
