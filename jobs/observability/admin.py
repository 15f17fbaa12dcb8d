"""The workers registry and the dashboard in the Django admin, staff only.

- **Workers** (``jobs_workerrecord``): read-only; each row says whether the engine is
  live, unhealthy (its heartbeats say its own database steps fail) or silent (no
  heartbeat for ``WORKERS_SILENT_AFTER`` heartbeats).
- **Dashboard**: per-queue depth and running jobs, finished and failed jobs per minute
  over the last hour as charts, the oldest waiting job, workers, the next runs of
  schedules, and the other apps' panels (outbox lag, sagas needing attention). It
  reloads itself every ``?refresh=`` seconds (default 10); charts are inline SVG and
  the page loads nothing from elsewhere. Every query is indexed (see
  :mod:`jobs.observability.reads`). Staff who may view jobs (``jobs.view_job``) see it,
  and in it only the panels whose model's own admin page lets them in: the workers
  (host, pid) with the view permission on workers, the schedules with the one on
  schedules, the outbox's and the sagas' panels likewise. A hidden panel's queries do
  not run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from ledon.admin import ModelAdmin, ReadOnlyModelAdmin
from ledon.dashboard import age, breadcrumbs, panels

from ..schedules.models import Schedule
from . import reads
from .charts import per_minute
from .models import Dashboard, WorkerRecord
from .worker_registry import silent_after

#: Seconds between two reloads of the dashboard, unless ``?refresh=`` says otherwise.
REFRESH_SECONDS = 10


@admin.register(WorkerRecord)
class WorkerRecordAdmin(ReadOnlyModelAdmin[WorkerRecord]):
    list_display = (
        "kind",
        "engine_id",
        "state",
        "host",
        "pid",
        "queue_list",
        "concurrency",
        "running",
        "version",
        "started_at",
        "last_heartbeat_at",
    )
    list_filter = ("kind",)
    search_fields = ("engine_id", "host")
    search_help_text = "Worker id or host (contains)."
    fields = readonly_fields = list_display
    actions = None

    @admin.display(description="state")
    def state(self, obj: WorkerRecord) -> str:
        return worker_state(obj, timezone.now())

    @admin.display(description="queues")
    def queue_list(self, obj: WorkerRecord) -> str:
        return ", ".join(obj.queues) or "all"


@admin.register(Dashboard)
class DashboardAdmin(ModelAdmin[Dashboard]):
    """The dashboard, as the admin's "Dashboard" entry (its list page)."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff) and request.user.has_perm(
            "jobs.view_job"
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:

        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        refresh = _refresh(request.GET.get("refresh"))
        queues = reads.queue_states(now)
        throughput = reads.throughput(now)
        names = sorted({q.queue for q in queues} | set(throughput.succeeded))
        charts = []
        for name in names:
            ok, bad = throughput.succeeded.get(name, []), throughput.failed.get(name, [])
            if not ok:
                continue
            total_ok, total_bad = sum(ok), sum(bad)
            charts.append(
                {
                    "queue": name,
                    "succeeded": total_ok,
                    "failed": total_bad,
                    "peak": max(s + f for s, f in zip(ok, bad, strict=True)),
                    "svg": per_minute(
                        ok,
                        bad,
                        title=f"{name}: {total_ok} succeeded and {total_bad} failed "
                        "per minute, last hour",
                    ),
                }
            )
        oldest = reads.oldest_waiting(now)

        def may_view(model: type[Model]) -> bool:
            return self.may_view(request, model)

        show_workers = may_view(WorkerRecord)
        heard, silent = reads.workers(now) if show_workers else ([], [])
        live = [w for w in heard if w.unhealthy_since is None]
        unhealthy = [w for w in heard if w.unhealthy_since is not None]
        show_schedules = may_view(Schedule)
        context = {
            **self.admin_site.each_context(request),
            "title": "Dashboard",
            "opts": self.opts,
            "breadcrumbs": breadcrumbs(
                ("Home", reverse("admin:index")),
                ("Jobs", reverse("admin:app_list", kwargs={"app_label": "jobs"})),
                ("Dashboard", ""),
            ),
            "now": now,
            "refresh": refresh,
            "queues": [
                {
                    "name": q.queue,
                    "queued": q.queued,
                    "running": q.running,
                    "oldest": age(q.oldest_due_age(now)) if q.oldest_due_at else "",
                }
                for q in queues
            ],
            "charts": charts,
            "oldest": oldest,
            "oldest_age": age((now - oldest.next_run_at).total_seconds()) if oldest else "",
            "oldest_link": (
                reverse("admin:jobs_job_change", args=[oldest.pk]) if oldest is not None else ""
            ),
            "show_workers": show_workers,
            "live": [(w, age((now - w.last_heartbeat_at).total_seconds())) for w in live],
            "unhealthy": [(w, worker_state(w, now)) for w in unhealthy],
            "silent": [(w, age((now - w.last_heartbeat_at).total_seconds())) for w in silent],
            "show_schedules": show_schedules,
            "schedules": reads.next_schedules() if show_schedules else [],
            "panels": panels(now, may_view),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/jobs/dashboard.html", context)

    def may_view(self, request: HttpRequest, model: type[Model]) -> bool:
        """Whether ``model``'s own admin page lets the user in: the dashboard shows a
        panel about a model's rows only then (a model without an admin page: its view
        or change permission)."""
        try:
            return self.admin_site.get_model_admin(model).has_view_permission(request)
        except NotRegistered:
            opts = model._meta
            return any(
                request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
                for action in ("view", "change")
            )


def worker_state(row: WorkerRecord, now: datetime) -> str:
    """``live``, ``unhealthy for 2 min 5 s: <why>`` or ``silent for 10 min 0 s``."""
    silent_for = (now - row.last_heartbeat_at).total_seconds()
    if silent_for > silent_after().total_seconds():
        return f"silent for {age(silent_for)}"
    if row.unhealthy_since is not None:
        since = age((now - row.unhealthy_since).total_seconds())
        return f"unhealthy for {since}: {row.unhealthy_reason or 'its database steps fail'}"
    return "live"


def _refresh(value: str | None) -> int:
    """Seconds between reloads: ``?refresh=`` (0 turns reloading off), else the default."""
    if value is None:
        return REFRESH_SECONDS
    try:
        return min(max(int(value), 0), 3600)
    except ValueError:
        return REFRESH_SECONDS
