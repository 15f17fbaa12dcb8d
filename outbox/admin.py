"""Inspection of the outbox and the inbox in the Django admin.

Nothing is editable by hand. The outbox's only state changes are the "Redeliver
now" and "Park" actions, which go through :mod:`outbox.store` and are offered only
to users holding ``outbox.change_outboxmessage`` (the admin never edits a message,
so that permission means "may steer delivery"). The inbox is read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ledon.admin import (
    GrowingTableMixin,
    ReadOnlyModelAdmin,
    fieldset_fields,
    indented_json,
    report_changes,
    state_action,
)

from . import store
from .exceptions import InvalidTransition, MessageNotFound
from .models import InboxMessage, OutboxMessage


def _pretty_json(value: Any) -> SafeString:
    return format_html('<pre style="white-space: pre-wrap">{}</pre>', indented_json(value))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(GrowingTableMixin, ReadOnlyModelAdmin[OutboxMessage]):
    list_display = (
        "message_id",
        "event_type",
        "key",
        "status",
        "attempts",
        "available_at",
        "created_at",
        "sent_at",
    )
    list_filter = ("status", "event_type")
    search_fields = ("=message_id", "key")
    search_help_text = "Message id (exact) or key (contains)."
    ordering = ("-created_at", "-id")
    actions = ("redeliver_messages", "park_messages")
    fieldsets = (
        (None, {"fields": ("message_id", "event_type", "key", "status", "attempts")}),
        ("Payload", {"fields": ("payload_pretty", "headers_pretty")}),
        ("Delivery", {"fields": ("available_at", "last_error_pre", "sent_at")}),
        ("Timestamps", {"fields": ("created_at", "updated_at")}),
        ("Lease", {"fields": ("leased_by", "lease_expires_at"), "classes": ("collapse",)}),
    )
    # The lease token is deliberately not shown: it is the batch's write capability.
    readonly_fields = fieldset_fields(fieldsets)

    @admin.display(description="payload")
    def payload_pretty(self, obj: OutboxMessage) -> SafeString:
        return _pretty_json(obj.payload_json)

    @admin.display(description="headers")
    def headers_pretty(self, obj: OutboxMessage) -> SafeString:
        return _pretty_json(obj.headers)

    @admin.display(description="last error")
    def last_error_pre(self, obj: OutboxMessage) -> SafeString | str:
        if not obj.last_error:
            return "-"
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.last_error)

    @state_action("Redeliver selected messages now")
    def redeliver_messages(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        """Pending or parked messages become due now (parked ones with fresh attempts)."""
        self._apply(request, queryset, lambda m: store.redeliver(m), "redelivered")

    @state_action("Park selected messages")
    def park_messages(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        """Pending messages stop being delivered until redelivered."""
        reason = f"parked by {request.user.get_username()} in the admin"
        self._apply(request, queryset, lambda m: store.park(m, reason), "parked")

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[OutboxMessage],
        change: Callable[[Any], None],
        verb: str,
    ) -> None:
        done = 0
        refusals: list[str] = []
        for message_id in queryset.values_list("message_id", flat=True):
            try:
                change(message_id)
            except (MessageNotFound, InvalidTransition) as exc:
                refusals.append(str(exc))
            else:
                done += 1
        report_changes(self, request, done, verb, refusals)


@admin.register(InboxMessage)
class InboxMessageAdmin(GrowingTableMixin, ReadOnlyModelAdmin[InboxMessage]):
    list_display = ("consumer", "message_id", "processed_at")
    list_filter = ("consumer",)
    search_fields = ("=message_id",)
    search_help_text = "Message id (exact)."
    ordering = ("-processed_at", "-id")
    fields = readonly_fields = ("consumer", "message_id", "processed_at")
