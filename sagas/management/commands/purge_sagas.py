"""``manage.py purge_sagas``: retention on demand — delete old finished saga instances."""

from __future__ import annotations

from collections.abc import Sequence

from ledon.retention import Purge, PurgeCommand
from sagas import store
from sagas.conf import sagas_settings
from sagas.models import SagaInstance


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
                sagas_settings,
                "RETENTION_SECONDS",
                store.purge_finished,
                SagaInstance.objects.finished,
                "finished_at",
            )
        ]
