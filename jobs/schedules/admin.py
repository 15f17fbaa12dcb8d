"""Schedules in the Django admin: read-only, with their next run and their last run's
job (linked to its page), and the "Pause", "Resume" and "Run now" actions, which go
through :mod:`jobs.schedules.store` and are offered only to users holding
``jobs.change_schedule``."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ledon.admin import ReadOnlyModelAdmin, report_refusals, state_action

from ..exceptions import InvalidSchedule, JobsError
from ..models import Job
from ..types import JobStatus
from . import declarations, service
from . import store as schedule_store
from .models import Schedule
from .types import ScheduleOutcome


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyModelAdmin[Schedule]):
    list_display = (
        "name",
        "timetable",
        "next_run",
        "last_run",
        "last_run_status",
        "paused",
        "state",
        "catch_up",
    )
    list_filter = ("paused", "catch_up")
    search_fields = ("name",)
    search_help_text = "Schedule name (contains)."
    ordering = ("name",)
    actions = ("pause_schedules", "resume_schedules", "run_schedules_now")
    fields = readonly_fields = (
        "name",
        "timetable",
        "state",
        "handler_with_version",
        "queue",
        "catch_up",
        "next_run",
        "last_period",
        "last_run",
        "last_run_status",
        "last_enqueued_at",
        "paused",
        "paused_at",
        "created_at",
        "updated_at",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        last_job = Job.objects.for_scope(service.scope_hash()).filter(
            job_id=OuterRef("last_job_id")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                last_job_pk=Subquery(last_job.values("pk")[:1]),
                last_job_status=Subquery(last_job.values("status")[:1]),
            )
        )

    # ------------------------------------------------------------------ columns

    def _declared(self) -> dict[str, tuple[str, int, str]]:
        declarations.discover()
        try:
            return {spec.name: spec.timetable_key for spec in declarations.declared()}
        except InvalidSchedule:
            return {}

    @admin.display(description="timetable")
    def timetable(self, obj: Schedule) -> str:
        try:
            return schedule_store.timetable_of(schedule_store.state_of(obj)).describe()
        except InvalidSchedule as exc:
            return str(exc)

    @admin.display(description="state")
    def state(self, obj: Schedule) -> str:
        declared = self._declared().get(obj.name)
        if declared is None:
            return "orphaned (no longer declared: never enqueued)"
        if declared != (obj.cron, obj.every_seconds, obj.timezone):
            return "defined differently in this deploy"
        return "paused" if obj.paused else "active"

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, obj: Schedule) -> Any:
        if obj.paused or obj.name not in self._declared():
            return "-"
        return obj.next_run_at

    @admin.display(description="handler", ordering="handler")
    def handler_with_version(self, obj: Schedule) -> str:
        return f"{obj.handler}@{obj.handler_version}"

    @admin.display(description="last run", ordering="last_job_id")
    def last_run(self, obj: Schedule) -> SafeString | str:
        pk = getattr(obj, "last_job_pk", None)
        if pk is None:
            return obj.last_job_id or "-"
        url = reverse(f"admin:{Job._meta.app_label}_{Job._meta.model_name}_change", args=[pk])
        return format_html('<a href="{}">{}</a>', url, obj.last_job_id)

    @admin.display(description="last run's status")
    def last_run_status(self, obj: Schedule) -> str:
        status = getattr(obj, "last_job_status", None)
        return JobStatus(status).label if status else "-"

    # ------------------------------------------------------------------ actions

    def _each(
        self, request: HttpRequest, queryset: QuerySet[Schedule], step: Any, verb: str
    ) -> tuple[Counter[Any], list[str]]:
        outcomes: Counter[Any] = Counter()
        refusals: list[str] = []
        for name in queryset.values_list("name", flat=True):
            try:
                outcomes[step(name)] += 1
            except JobsError as exc:
                refusals.append(f"{name}: {exc}")
        report_refusals(self, request, refusals, verb)
        return outcomes, refusals

    def _change_state(
        self,
        request: HttpRequest,
        queryset: QuerySet[Schedule],
        step: Any,
        changed: tuple[ScheduleOutcome, str],
        unchanged: tuple[ScheduleOutcome, str],
    ) -> None:
        """Pause or resume each schedule; one message: how many changed, how many
        already were so (each ``(outcome, words)``)."""
        outcomes, _ = self._each(request, queryset, step, f"not {changed[1]}")
        done = outcomes[changed[0]]
        text = f"{done} {changed[1]}, {outcomes[unchanged[0]]} {unchanged[1]}."
        self._summary(request, done, text)

    @state_action("Pause selected schedules")
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """No period is enqueued while paused (every worker, from its next pass)."""
        paused = (ScheduleOutcome.PAUSED, "paused")
        already = (ScheduleOutcome.ALREADY_PAUSED, "already paused")
        self._change_state(request, queryset, service.pause, paused, already)

    @state_action("Resume selected schedules")
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """From the first period starting now or later; paused periods are not run."""
        resumed = (ScheduleOutcome.RESUMED, "resumed")
        not_paused = (ScheduleOutcome.NOT_PAUSED, "were not paused")
        self._change_state(request, queryset, service.resume, resumed, not_paused)

    @state_action("Run selected schedules now")
    def run_schedules_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """One extra job each, at once, with a ``@manual-…`` job id."""
        outcomes, _ = self._each(
            request, queryset, lambda name: service.run_now(name).job_id, "not run"
        )
        started = sum(outcomes.values())
        listed = ", ".join(sorted(outcomes)[:10])
        self._summary(request, started, f"{started} run started{': ' + listed if listed else ''}.")

    def _summary(self, request: HttpRequest, changed: int, text: str) -> None:
        self.message_user(request, text, messages.SUCCESS if changed else messages.WARNING)
