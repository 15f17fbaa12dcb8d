"""Batches and sequences in the Django admin, read-only: a batch's page with its
counts, its jobs and its ``then`` job; sequences with whether they are halted, by
which Failed job and why; and, on a job's page, links to its batch and sequence.

Nothing here changes state: a halted sequence goes on when an operator retries or
cancels the Failed job that halts it, with the job admin's actions (which call the
store).
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ledon.admin import ReadOnlyModelAdmin

from .models import Batch, Job, Sequence
from .store.batches import then_job_id


def _jobs_url(**filters: str) -> str:
    """The job list filtered by ``filters`` (fields of the job)."""
    return f"{reverse('admin:jobs_job_changelist')}?{urlencode(filters)}"


def _job_link(scope_hash: str, job_id: str) -> SafeString | str:
    """A link to job ``job_id`` of the scope, or its id alone if it is gone."""
    pk = (
        Job.objects.filter(scope_hash=scope_hash, job_id=job_id)
        .values_list("pk", flat=True)
        .first()
    )
    if pk is None:
        return f"{job_id} (not stored)"
    return format_html('<a href="{}">{}</a>', reverse("admin:jobs_job_change", args=[pk]), job_id)


def halt_reason(sequence: Sequence) -> str:
    """Why a sequence is halted, rendered from its state: the Failed job that halts
    it and that job's error. "-" for a sequence that is not halted."""
    if sequence.halted_by is None:
        return "-"
    error = (
        Job.objects.filter(scope_hash=sequence.scope_hash, job_id=sequence.halted_by)
        .values_list("error", flat=True)
        .first()
    )
    why = f": {error.splitlines()[0][:200]}" if error else ""
    return (
        f"job {sequence.halted_by!r} failed and its handler halts the sequence on a "
        f"failure{why}; retry or cancel that job to go on"
    )


class JobOrderingFields:
    """The job page's links to its batch and its sequence (mixed into the job admin)."""

    @admin.display(description="batch")
    def batch_link(self, obj: Job) -> SafeString | str:
        if obj.batch_id is None:
            return "-"
        pk = (
            Batch.objects.filter(scope_hash=obj.scope_hash, batch_id=obj.batch_id)
            .values_list("pk", flat=True)
            .first()
        )
        if pk is None:
            return obj.batch_id
        url = reverse("admin:jobs_batch_change", args=[pk])
        others = _jobs_url(scope_hash=obj.scope_hash, batch_id=obj.batch_id)
        return format_html(
            '<a href="{}">{}</a> (<a href="{}">its jobs</a>)', url, obj.batch_id, others
        )

    @admin.display(description="sequence")
    def sequence_state(self, obj: Job) -> SafeString | str:
        if obj.sequence_key is None:
            return "-"
        sequence = Sequence.objects.filter(
            scope_hash=obj.scope_hash, sequence_key=obj.sequence_key
        ).first()
        held = " — held: waits for an earlier job of it" if obj.sequence_held else ""
        if sequence is None:
            return f"{obj.sequence_key}{held}"
        url = reverse("admin:jobs_sequence_change", args=[sequence.pk])
        halted = f" — halted: {halt_reason(sequence)}" if sequence.halted_by else ""
        return format_html('<a href="{}">{}</a>{}{}', url, obj.sequence_key, held, halted)


#: A batch's counts, as its list and its page show them.
_COUNTS = ("total", "pending", "succeeded", "failed", "cancelled", "expired")


@admin.register(Batch)
class BatchAdmin(ReadOnlyModelAdmin[Batch]):
    """Batches with their counts; a batch's page links to its jobs and its then."""

    list_display = ("batch_id", "status", *_COUNTS, "created_at", "finished_at")
    search_fields = ("batch_id",)
    search_help_text = "Batch id (contains)."
    ordering = ("-created_at", "-id")
    fields = readonly_fields = (
        "batch_id",
        "scope_hash",
        "status",
        *_COUNTS,
        "jobs",
        "then",
        "created_at",
        "finished_at",
    )

    @admin.display(description="status")
    def status(self, obj: Batch) -> str:
        return "open" if obj.pending else "done"

    @admin.display(description="jobs")
    def jobs(self, obj: Batch) -> SafeString:
        url = _jobs_url(scope_hash=obj.scope_hash, batch_id=obj.batch_id)
        return format_html('<a href="{}">the batch\'s {} jobs</a>', url, obj.total)

    @admin.display(description="then")
    def then(self, obj: Batch) -> SafeString | str:
        if obj.then_handler is None:
            return "-"
        job_id = obj.then_job_id or then_job_id(obj.batch_id)
        if obj.pending:
            return f"{obj.then_handler}, submitted as {job_id!r} when the last job ends"
        return _job_link(obj.then_scope_hash or obj.scope_hash, job_id)


class HaltedFilter(admin.SimpleListFilter):
    title = "halted"
    parameter_name = "halted"

    def lookups(self, request: object, model_admin: object) -> list[tuple[str, str]]:
        return [("yes", "Halted"), ("no", "Going on")]

    def queryset(self, request: object, queryset):  # type: ignore[no-untyped-def]
        if self.value() == "yes":
            return queryset.filter(halted_by__isnull=False)
        if self.value() == "no":
            return queryset.filter(halted_by__isnull=True)
        return queryset


@admin.register(Sequence)
class SequenceAdmin(ReadOnlyModelAdmin[Sequence]):
    """Sequences: their open jobs, and whether they are halted, by which job, why."""

    list_display = ("sequence_key", "scope_hash", "open", "halted", "halted_at", "updated_at")
    list_filter = (HaltedFilter,)
    search_fields = ("sequence_key",)
    search_help_text = "Sequence key (contains)."
    ordering = ("-halted_at", "sequence_key")
    fields = readonly_fields = (
        "sequence_key",
        "scope_hash",
        "open",
        "jobs",
        "halted",
        "halted_job",
        "halted_at",
        "updated_at",
    )

    @admin.display(description="halted", boolean=False)
    def halted(self, obj: Sequence) -> str:
        return halt_reason(obj)

    @admin.display(description="halted by")
    def halted_job(self, obj: Sequence) -> SafeString | str:
        return "-" if obj.halted_by is None else _job_link(obj.scope_hash, obj.halted_by)

    @admin.display(description="jobs")
    def jobs(self, obj: Sequence) -> SafeString:
        url = _jobs_url(scope_hash=obj.scope_hash, sequence_key=obj.sequence_key)
        return format_html('<a href="{}">its jobs</a>', url)
