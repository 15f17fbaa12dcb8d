"""``manage.py purge_outbox``: retention on demand — delete old sent messages,
parked ones without a key, and inbox records."""

from __future__ import annotations

from collections.abc import Sequence

from ledon.retention import Purge, PurgeCommand
from outbox import store
from outbox.conf import outbox_settings
from outbox.models import InboxMessage, OutboxMessage


class Command(PurgeCommand):
    help = (
        "Delete sent outbox messages, parked ones without a key and inbox records older "
        "than their retention (OUTBOX['RETENTION_SECONDS'], 7 days; "
        "OUTBOX['PARKED_RETENTION_SECONDS'], 30 days; OUTBOX['INBOX_RETENTION_SECONDS'], "
        "14 days); pending messages, and parked ones that halt their key, are never "
        "touched."
    )

    def purges(self) -> Sequence[Purge]:
        return [
            Purge(
                "sent message(s)",
                outbox_settings,
                "RETENTION_SECONDS",
                store.purge_sent,
                OutboxMessage.objects.sent,
                "sent_at",
            ),
            Purge(
                "parked message(s)",
                outbox_settings,
                "PARKED_RETENTION_SECONDS",
                store.purge_parked,
                OutboxMessage.objects.parked_without_key,
                "updated_at",
            ),
            Purge(
                "inbox record(s)",
                outbox_settings,
                "INBOX_RETENTION_SECONDS",
                store.purge_inbox,
                InboxMessage.objects.all,
                "processed_at",
            ),
        ]
