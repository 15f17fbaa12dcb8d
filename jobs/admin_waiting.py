"""Why jobs wait, in the Django admin: a job's reasons, one a line, on its page, and
the queues' page of limit keys — each limit with Queued or Running jobs, as a whole
and per limit key, against its cap and its rate (what ``manage.py jobs_queues keys``
prints). Reads only, from :mod:`jobs.store.waiting`."""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ledon.admin import ReadOnlyModelAdmin

from . import validation
from .exceptions import InvalidInput
from .models import Job, Queue
from .store import waiting
from .store.waiting import KeyState


def reasons_html(job: Job) -> SafeString | str:
    """Why ``job`` has not started, one reason a line ("-" when it is not Queued)."""
    reasons: Sequence[waiting.WaitReason] = waiting.reasons_of(
        job, timezone.now(), waiting.claim_limits()
    )
    if not reasons:
        return "-"
    lines = ((reason.describe(),) for reason in reasons)
    return format_html(
        '<ul class="jobs-waiting">{}</ul>', format_html_join("", "<li>{}</li>", lines)
    )


class LimitKeysPage(ReadOnlyModelAdmin[Queue]):
    """The queue admin's *Limit keys* page (``keys/``, ``?queue=NAME`` for the limits
    that queue's jobs fall under), for whoever may view queues."""

    def get_urls(self) -> list[URLPattern]:
        own = [
            path("keys/", self.admin_site.admin_view(self.limit_keys_view), name="jobs_queue_keys")
        ]
        return own + super().get_urls()

    def limit_keys_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        queue = request.GET.get("queue") or None
        states: list[KeyState] = []
        try:
            if queue is not None:
                queue = validation.name(queue, "queue", validation.MAX_QUEUE_LENGTH)
            states = waiting.key_states(queue)
        except InvalidInput as exc:
            messages.error(request, str(exc))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Limit keys of queue {queue}" if queue else "Limit keys",
            "opts": self.opts,
            "headings": KeyState.HEADINGS,
            "rows": [(state.full, state.cells()) for state in states],
        }
        return TemplateResponse(request, "admin/jobs/queue/limit_keys.html", context)
