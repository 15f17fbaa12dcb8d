"""Inspection of the outbox and the inbox in the Django admin.

Nothing is editable by hand. The outbox's only state changes are the "Redeliver
now", "Park" and "Discard" actions, which go through :mod:`outbox.store` and are
offered only to users holding ``outbox.change_outboxmessage`` (the admin never edits
a message, so that permission means "may steer delivery"). The "Key order" filter
shows the keys a parked message halts, with the message and its error, and the
messages waiting behind them. The inbox is read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.text import Truncator

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
from .types import MessageStatus


def _pretty_json(value: Any) -> SafeString:
    return format_html('<pre style="white-space: pre-wrap">{}</pre>', indented_json(value))


class KeyOrderFilter(admin.SimpleListFilter):
    """Messages by their place in their key's order: the parked messages that halt
    their key (each key's first unsent message, parked), and the messages waiting
    behind an earlier unsent message of their key."""

    title = "key order"
    parameter_name = "key_order"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("halts", "Halts its key (parked, first of its key)"),
            ("waits", "Waits behind an earlier message of its key"),
        ]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage]
    ) -> QuerySet[OutboxMessage]:
        if self.value() == "halts":
            return queryset.filter(pk__in=OutboxMessage.objects.halting().values("pk"))
        if self.value() == "waits":
            return queryset.filter(held=True)
        return queryset


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
        "last_error_short",
    )
    list_filter = ("status", KeyOrderFilter, "event_type")
    search_fields = ("=message_id", "key")
    search_help_text = "Message id (exact) or key (contains)."
    ordering = ("-created_at", "-id")
    actions = ("redeliver_messages", "park_messages", "discard_messages")
    fieldsets = (
        (None, {"fields": ("message_id", "event_type", "key", "status", "attempts")}),
        ("Payload", {"fields": ("payload_pretty", "headers_pretty")}),
        ("Delivery", {"fields": ("available_at", "key_order", "last_error_pre", "sent_at")}),
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

    @admin.display(description="last error")
    def last_error_short(self, obj: OutboxMessage) -> str:
        return Truncator(obj.last_error.partition("\n")[0]).chars(80) or "-"

    @admin.display(description="key order")
    def key_order(self, obj: OutboxMessage) -> SafeString | str:
        """Where the message stands in its key's order, with a link to the messages
        that wait behind it."""
        if not obj.key:
            return "no key: delivered in any order"
        if obj.held:
            return "waits for an earlier message of its key"
        if obj.status == MessageStatus.SENT:
            return "sent"
        waiting = OutboxMessage.objects.held().filter(key=obj.key).count()
        state = (
            "halts its key until redelivered or discarded"
            if obj.status == MessageStatus.PARKED
            else "first of its key"
        )
        if not waiting:
            return state
        url = reverse("admin:outbox_outboxmessage_changelist")
        query = urlencode({"key__exact": obj.key, "key_order": "waits"})
        return format_html(
            '{}: <a href="{}?{}">{} message(s) wait behind it</a>', state, url, query, waiting
        )

    @state_action("Redeliver selected messages now")
    def redeliver_messages(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        """Pending or parked messages become due now (parked ones with fresh attempts)."""
        self._apply(request, queryset, lambda m: store.redeliver(m), "redelivered")

    @state_action("Park selected messages")
    def park_messages(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        """Pending messages stop being delivered until redelivered."""
        reason = f"parked by {request.user.get_username()} in the admin"
        self._apply(request, queryset, lambda m: store.park(m, reason), "parked")

    @state_action("Discard selected parked messages")
    def discard_messages(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        """Parked messages are deleted, never to be delivered; a key they halted goes
        on with its next message."""
        self._apply(request, queryset, lambda m: store.discard(m), "discarded")

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[OutboxMessage],
        change: Callable[[Any], object],
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
