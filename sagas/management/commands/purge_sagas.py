"""``manage.py purge_sagas``: retention on demand — delete old finished saga instances."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ledon.retention import Purge, PurgeCommand
from sagas import store
from sagas.conf import sagas_settings
from sagas.models import SagaInstance


def _count(cutoff: datetime) -> int:
    return SagaInstance.objects.finished().filter(finished_at__lt=cutoff).count()


class Command(PurgeCommand):
    help = (
        "Delete succeeded and compensated saga instances that finished longer ago than "
        "the retention (SAGAS['RETENTION_SECONDS'], 14 days by default); running, "
        "compensating and failed instances are never touched."
    )

    def purges(self) -> Sequence[Purge]:
        return [
            Purge(
                "finished saga instance(s)",
                "SAGAS['RETENTION_SECONDS']",
                lambda: sagas_settings().RETENTION_SECONDS,
                store.purge_finished,
                _count,
            )
        ]
