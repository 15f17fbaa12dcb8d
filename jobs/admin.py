"""Read-only inspection of jobs and their attempts in the Django admin.

Nothing is editable by hand: no form ever saves a job or an attempt, and nothing can
be added or deleted here. The only state changes are the "Cancel" and "Retry"
actions, which go through :mod:`jobs.store` exactly like the scoped API does, and are
offered only to users holding ``jobs.change_job`` (the admin never edits a job, so
that permission means "may steer jobs"). Staff with only ``jobs.view_job`` see the
pages and no actions. Chosen with "Select all N", "Cancel" and "Retry" act on every
job the filters and search match, by filter (:mod:`jobs.bulk`), after a confirmation
page with the dry run's counts. Queues are listed with their depth and limits, and
paused or resumed by actions guarded by ``jobs.change_queue``. A scope's weight is set
on a page of its own, through the store, behind ``jobs.change_scopeweight``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ledon.admin import (
    GrowingTableMixin,
    ReadOnlyAdminMixin,
    ReadOnlyModelAdmin,
    TabularInline,
    fieldset_fields,
    indented_json,
    report_changes,
    report_refusals,
    state_action,
)
from ledon.bulk_admin import BulkAdminMixin, selected_across

from . import bulk, store, validation
from .admin_ordering import JobOrderingFields
from .admin_waiting import LimitKeysPage, reasons_html
from .conf import queue_limits
from .exceptions import InvalidInput, InvalidTransition, InvalidWeight, JobNotFound, JobsError
from .fair_share import check_weight
from .handlers import library_handlers
from .models import Job, JobAttempt, Lane, Queue, ScopeWeight
from .types import AttemptStatus, CancelOutcome, JobStatus


def _percent(value: float | None, *, succeeded: bool = False) -> str:
    # A handler need not report 100% before it returns: a success is all done.
    if succeeded:
        return "100%"
    return "-" if value is None else f"{value:g}%"


#: What the admin shows of an attempt. The token is deliberately not shown: it is the
#: attempt's write capability.
ATTEMPT_FIELDS = (
    "number",
    "status",
    "worker_id",
    "progress_percent",
    "progress_message",
    "error",
    "result_ref",
    "started_at",
    "finished_at",
)


class JobAttemptInline(ReadOnlyAdminMixin, TabularInline[JobAttempt, Job]):
    """The attempts of one job, oldest first, read-only."""

    model = JobAttempt
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ("number",)
    fields = readonly_fields = ATTEMPT_FIELDS

    @admin.display(description="progress")
    def progress_percent(self, obj: JobAttempt) -> str:
        return _percent(obj.progress, succeeded=obj.status == AttemptStatus.SUCCEEDED)


class EngineJobsFilter(admin.SimpleListFilter):
    """Hides the jobs of the library's own handlers (``@job_handler(library=True)``:
    the workflow engine's advances) unless asked: they are plumbing, and one run
    makes several. The jobs that run your code (an activity's items among them)
    are always listed."""

    title = "engine jobs"
    parameter_name = "engine"
    SHOWN = "shown"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [("", "Hidden"), (self.SHOWN, "Shown")]

    def choices(self, changelist: Any) -> Any:
        # Two choices and no "All": hidden is the default, with no parameter.
        for value, label in self.lookup_choices:
            yield {
                "selected": (self.value() or "") == value,
                "query_string": changelist.get_query_string(
                    {self.parameter_name: value} if value else {}, [self.parameter_name]
                ),
                "display": label,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # A handler chosen in the handler filter is listed whatever it is.
        if self.value() == self.SHOWN or "handler__exact" in request.GET:
            return queryset
        return queryset.exclude(handler__in=sorted(library_handlers()))


class RetryOptions(forms.Form):
    """The option of a retry of every matching job: attempts granted to each."""

    extra_attempts = forms.IntegerField(
        min_value=0,
        max_value=validation.MAX_ATTEMPTS_LIMIT,
        initial=0,
        label="Extra attempts for each job",
        help_text="Raises each job's max_attempts by this much, as "
        "JobScope.retry(extra_attempts=N) does: a job that used all of its attempts is "
        "retried only with at least 1. Change it, then count again.",
    )


@admin.register(Job)
class JobAdmin(BulkAdminMixin, JobOrderingFields, GrowingTableMixin, ReadOnlyModelAdmin[Job]):
    list_display = (
        "job_id",
        "handler_with_version",
        "status_display",
        "queue",
        "priority",
        "attempts",
        "progress_percent",
        "next_run_at",
        "created_at",
    )
    list_filter = (
        "status",
        "keeps_killing_worker",
        "queue",
        "handler",
        "cancel_requested",
        EngineJobsFilter,
    )
    search_fields = ("job_id",)
    search_help_text = (
        "Job id (contains), or a scope: its 64-character hash or the scope string "
        "your code passes (exact)."
    )
    ordering = ("-created_at", "-id")
    # Counting the whole table on every page is slow once history grows.
    inlines = (JobAttemptInline,)
    actions = ("cancel_jobs", "retry_jobs")
    bulk_error = InvalidInput
    bulk_errors = (JobsError,)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "job_id",
                    "scope_hash",
                    "handler_with_version",
                    "queue",
                    "priority",
                    "status_display",
                    "attempts",
                    "interruption_count",
                )
            },
        ),
        (
            "Progress and outcome",
            {"fields": ("progress_percent", "progress_message", "error", "result_ref")},
        ),
        ("Payload", {"fields": ("payload_pretty",)}),
        (
            "Schedule",
            {
                "fields": (
                    "initial_not_before",
                    "next_run_at",
                    "created_at",
                    "started_at",
                    "finished_at",
                    "updated_at",
                    "handler_unknown_since",
                )
            },
        ),
        (
            "Who goes next",
            {
                "fields": (
                    "waiting",
                    "fair_at",
                    "start_by",
                    "unique_key",
                    "unique_while",
                    "debounce_until",
                    "batch_link",
                    "sequence_state",
                )
            },
        ),
        ("Lease", {"fields": ("leased_by", "lease_expires_at"), "classes": ("collapse",)}),
    )
    readonly_fields = fieldset_fields(fieldsets)

    @admin.display(description="why it waits")
    def waiting(self, obj: Job) -> SafeString | str:
        """Why a Queued job has not started, one reason a line (see
        :mod:`jobs.store.waiting`, which ``manage.py jobs_queues why`` prints too)."""
        return reasons_html(obj)

    # ------------------------------------------------------------------ columns

    @admin.display(description="handler", ordering="handler")
    def handler_with_version(self, obj: Job) -> str:
        return f"{obj.handler}@{obj.handler_version}"

    @admin.display(description="status", ordering="status")
    def status_display(self, obj: Job) -> str:
        label = obj.get_status_display()
        if obj.keeps_killing_worker:
            return f"{label} ({Job._meta.get_field('keeps_killing_worker').verbose_name})"
        return f"{label} (cancel requested)" if obj.cancel_requested else label

    @admin.display(description="attempts", ordering="attempt_count")
    def attempts(self, obj: Job) -> str:
        # Snoozed executions and interrupted attempts within the crash budget have
        # attempt rows but do not count as attempts.
        uncounted = [
            f"+{count} {what}"
            for count, what in (
                (obj.snooze_count, "snoozed"),
                (obj.interruption_count, "interrupted"),
            )
            if count
        ]
        more = f" ({', '.join(uncounted)})" if uncounted else ""
        return f"{obj.attempt_count}/{obj.max_attempts}{more}"

    @admin.display(description="progress", ordering="progress")
    def progress_percent(self, obj: Job) -> str:
        return _percent(obj.progress, succeeded=obj.status == JobStatus.SUCCEEDED)

    @admin.display(description="payload")
    def payload_pretty(self, obj: Job) -> SafeString:
        # In the order it was submitted: the payload is kept byte-exact.
        text = indented_json(obj.payload_json, sort_keys=False)
        return format_html('<pre class="jobs-payload">{}</pre>', text)

    # ------------------------------------------------------------------ search

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """Job ids by substring; scopes exactly, by hash or as the caller names them
        (the tenant of that name and the library's reserved scope of that name)."""
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if not term:
            return found, may_have_duplicates
        hashes = validation.scope_hashes_named(term)
        return found | queryset.filter(scope_hash__in=hashes), may_have_duplicates

    # ------------------------------------------------------------------ actions

    @state_action("Cancel selected jobs")
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        """Cancel through the store: Queued jobs at once, Running ones by request; with
        "Select all N", every matching job, by filter, once confirmed."""
        if selected_across(request):
            return self.bulk_by_filter(
                request,
                queryset,
                "cancel_jobs",
                bulk.cancel_action,
                explain="Queued jobs end Cancelled at once; Running ones are asked to stop "
                "(their handler sees the request, and they end Cancelled); finished ones "
                "are left as they are.",
            )
        outcomes: Counter[CancelOutcome] = Counter()
        refusals: list[str] = []
        for scope_hash, job_id in queryset.values_list("scope_hash", "job_id"):
            try:
                outcomes[store.cancel(scope_hash, job_id)] += 1
            except JobNotFound:
                refusals.append(f"job {job_id!r} no longer exists")
            except InvalidTransition as exc:
                refusals.append(str(exc))
        parts = [
            f"{outcomes[outcome]} {label}"
            for outcome, label in (
                (CancelOutcome.CANCELLED, "cancelled"),
                (CancelOutcome.REQUESTED, "cancel requested"),
                (CancelOutcome.ALREADY_FINISHED, "already finished"),
            )
            if outcomes[outcome]
        ]
        if refusals:
            parts.append(f"{len(refusals)} not cancelled")
        changed = outcomes[CancelOutcome.CANCELLED] + outcomes[CancelOutcome.REQUESTED]
        self.message_user(
            request, ", ".join(parts) + ".", messages.SUCCESS if changed else messages.WARNING
        )
        report_refusals(self, request, refusals, "not cancelled")
        return None

    @state_action("Retry selected jobs")
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        """Re-queue through the store, granting one extra attempt to a job that used
        all of its own; jobs whose state forbids it are listed with why. With "Select
        all N", every matching job, by filter, with the extra attempts the confirmation
        page asks for."""
        if selected_across(request):
            return self.bulk_by_filter(
                request,
                queryset,
                "retry_jobs",
                bulk.retry_action,
                options=RetryOptions,
                explain="Failed, Cancelled and Interrupted jobs with an attempt left are "
                "queued again, with their earlier attempts kept; the others are left as "
                "they are.",
            )
        requeued = granted = 0
        refusals: list[str] = []
        rows = queryset.values_list("scope_hash", "job_id", "attempt_count", "max_attempts")
        for scope_hash, job_id, attempt_count, max_attempts in rows:
            # The operator asking is the grant; the store's guard still decides.
            extra = 1 if attempt_count >= max_attempts else 0
            try:
                store.retry(scope_hash, job_id, extra_attempts=extra)
            except JobNotFound:
                refusals.append(f"job {job_id!r} no longer exists")
            except InvalidInput as exc:
                refusals.append(str(exc))
            except InvalidTransition as exc:
                refusals.append(str(exc))
            else:
                requeued += 1
                granted += extra
        verb = "re-queued"
        if granted:
            verb += f" ({granted} with one extra attempt granted, having used all of theirs)"
        report_changes(self, request, requeued, verb, refusals)
        return None


@admin.register(JobAttempt)
class JobAttemptAdmin(GrowingTableMixin, ReadOnlyModelAdmin[JobAttempt]):
    list_display = ("job_link", "number", "status", "worker_id", "started_at", "finished_at")
    # The first column already links to the job; the attempt opens from its number.
    list_display_links = ("number",)
    list_filter = ("status",)
    list_select_related = ("job",)
    search_fields = ("job__job_id", "worker_id")
    search_help_text = "Job id or worker id (contains)."
    ordering = ("-started_at", "-id")
    fields = readonly_fields = ("job", *ATTEMPT_FIELDS)

    @admin.display(description="job", ordering="job__job_id")
    def job_link(self, obj: JobAttempt) -> SafeString:
        url = reverse(
            f"admin:{Job._meta.app_label}_{Job._meta.model_name}_change", args=[obj.job.pk]
        )
        return format_html('<a href="{}">{}</a>', url, obj.job.job_id)

    @admin.display(description="progress")
    def progress_percent(self, obj: JobAttempt) -> str:
        return _percent(obj.progress, succeeded=obj.status == AttemptStatus.SUCCEEDED)


@admin.register(Queue)
class QueueAdmin(LimitKeysPage):
    """Queues that were paused or resumed once, with their depth, Running jobs
    and limits; "Pause" and "Resume" go through :mod:`jobs.store` and are offered to
    users holding ``jobs.change_queue``. ``manage.py jobs_queues`` lists every queue
    and pauses any by name. *Limit keys* shows each limit and limit key's state."""

    change_list_template = "admin/jobs/queue/change_list.html"

    list_display = ("name", "paused", "queued", "running", "limits", "paused_at")
    list_filter = ("paused",)
    search_fields = ("name",)
    ordering = ("name",)
    actions = ("pause_queues", "resume_queues")
    fields = readonly_fields = (
        "name",
        "paused",
        "queued",
        "running",
        "limits",
        "paused_at",
        "updated_at",
    )

    @admin.display(description="queued")
    def queued(self, obj: Queue) -> int:
        return Job.objects.filter(queue=obj.name, status=JobStatus.QUEUED).count()

    @admin.display(description="running")
    def running(self, obj: Queue) -> int:
        return Job.objects.filter(queue=obj.name).running().count()

    @admin.display(description="limits")
    def limits(self, obj: Queue) -> str:
        value = queue_limits().get(obj.name)
        return value.describe() if value else "none"

    @state_action("Pause selected queues")
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        """Every worker stops claiming from these queues with its next claim."""
        changed = sum(store.pause(name) for name in queryset.values_list("name", flat=True))
        self.message_user(request, f"{changed} queue(s) paused.", messages.SUCCESS)

    @state_action("Resume selected queues")
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        changed = sum(store.resume(name) for name in queryset.values_list("name", flat=True))
        self.message_user(request, f"{changed} queue(s) resumed.", messages.SUCCESS)


class ScopeWeightForm(forms.Form):
    """A scope's weight, by the scope's name as callers pass it."""

    scope = forms.CharField(help_text="The scope's name, as callers pass it.")
    weight = forms.FloatField(help_text="A number in (0, 100]; 1 is every scope's default.")

    def clean_scope(self) -> str:
        try:
            return validation.scope_hash(self.cleaned_data.get("scope"))
        except InvalidInput as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_weight(self) -> float:
        try:
            return check_weight(self.cleaned_data.get("weight"))
        except InvalidWeight as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(ScopeWeight)
class ScopeWeightAdmin(ReadOnlyModelAdmin[ScopeWeight]):
    """Each scope's share of every fair queue's starts (1 without a row), with its
    Queued and Running jobs. "Set a scope's weight" (a page of its own, for users
    holding ``jobs.change_scopeweight``) saves through :func:`jobs.store.set_weight`,
    as ``execution.set_scope_weight`` does; a weight is never deleted (set it to 1)."""

    change_list_template = "admin/jobs/scopeweight/change_list.html"
    list_display = ("scope_hash", "weight", "queued", "running", "updated_at")
    search_fields = ("scope_hash",)
    fields = readonly_fields = ("scope_hash", "weight", "queued", "running", "updated_at")

    @admin.display(description="queued")
    def queued(self, obj: ScopeWeight) -> int:
        return Job.objects.for_scope(obj.scope_hash).queued().count()

    @admin.display(description="running")
    def running(self, obj: ScopeWeight) -> int:
        return Job.objects.for_scope(obj.scope_hash).running().count()

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "set/",
                self.admin_site.admin_view(self.set_weight_view),
                name="jobs_scopeweight_set",
            )
        ]
        return own + super().get_urls()

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {"may_set_weight": self.has_steer_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra)

    def set_weight_view(self, request: HttpRequest) -> HttpResponse:
        """Set a scope's weight (GET: the form; POST: save it through the store)."""
        if not self.has_steer_permission(request):
            raise PermissionDenied
        form = ScopeWeightForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            scope_hash, weight = form.cleaned_data["scope"], form.cleaned_data["weight"]
            before = store.set_weight(scope_hash, weight)
            self.message_user(
                request,
                f"Weight of {scope_hash[:12]}… set to {weight:g} (it was {before:g}).",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(reverse("admin:jobs_scopeweight_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Set a scope's weight",
            "opts": self.opts,
            "form": form,
        }
        return TemplateResponse(request, "admin/jobs/scopeweight/set_weight.html", context)


@admin.register(Lane)
class LaneAdmin(ReadOnlyModelAdmin[Lane]):
    """Scope shares: each scope's line in each fair queue — its weight, its Queued
    and Running jobs there, and the place its latest job took. ``manage.py
    jobs_queues scopes`` shows the same."""

    list_display = ("queue", "scope_hash", "weight", "queued", "running", "tail")
    list_filter = ("queue",)
    search_fields = ("scope_hash",)
    fields = readonly_fields = ("queue", "scope_hash", "weight", "queued", "running", "tail")

    @admin.display(description="weight")
    def weight(self, obj: Lane) -> float:
        row = ScopeWeight.objects.filter(scope_hash=obj.scope_hash).first()
        return 1.0 if row is None else row.weight

    @admin.display(description="queued")
    def queued(self, obj: Lane) -> int:
        return Job.objects.for_scope(obj.scope_hash).filter(queue=obj.queue).queued().count()

    @admin.display(description="running")
    def running(self, obj: Lane) -> int:
        return Job.objects.for_scope(obj.scope_hash).filter(queue=obj.queue).running().count()


# The schedules' admin lives with the schedules; the workers
# registry and the dashboard with the rest of jobs.observability.
from .observability import admin as _observability_admin  # noqa: E402, F401
from .schedules import admin as _schedules_admin  # noqa: E402, F401
