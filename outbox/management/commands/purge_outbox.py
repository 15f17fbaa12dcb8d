"""``manage.py purge_outbox``: retention on demand — delete old sent and parked
messages and inbox records."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ledon.retention import Purge, PurgeCommand
from outbox import store
from outbox.conf import outbox_settings
from outbox.models import InboxMessage, OutboxMessage


def _sent(cutoff: datetime) -> int:
    return OutboxMessage.objects.sent().filter(sent_at__lt=cutoff).count()


def _parked(cutoff: datetime) -> int:
    return OutboxMessage.objects.parked().filter(updated_at__lt=cutoff).count()


def _inbox(cutoff: datetime) -> int:
    return InboxMessage.objects.filter(processed_at__lt=cutoff).count()


class Command(PurgeCommand):
    help = (
        "Delete sent outbox messages, parked ones and inbox records older than their "
        "retention (OUTBOX['RETENTION_SECONDS'], 7 days; OUTBOX['PARKED_RETENTION_SECONDS'], "
        "30 days; OUTBOX['INBOX_RETENTION_SECONDS'], 14 days); pending messages are never "
        "touched."
    )

    def purges(self) -> Sequence[Purge]:
        return [
            Purge(
                "sent message(s)",
                "OUTBOX['RETENTION_SECONDS']",
                lambda: outbox_settings().RETENTION_SECONDS,
                store.purge_sent,
                _sent,
            ),
            Purge(
                "parked message(s)",
                "OUTBOX['PARKED_RETENTION_SECONDS']",
                lambda: outbox_settings().PARKED_RETENTION_SECONDS,
                store.purge_parked,
                _parked,
            ),
            Purge(
                "inbox record(s)",
                "OUTBOX['INBOX_RETENTION_SECONDS']",
                lambda: outbox_settings().INBOX_RETENTION_SECONDS,
                store.purge_inbox,
                _inbox,
            ),
        ]
