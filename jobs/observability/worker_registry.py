"""The store of the workers registry (:class:`ledon.registry.RegistryStore`) over
``jobs_workerrecord``, installed by ``JobsConfig.ready()``. Each write is one short
transaction; a heartbeat or a removal only touches the row of the run that wrote it
(its token), so a killed run's late heartbeat never revives a replaced row."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce

from ledon.db import alias_for
from ledon.registry import EngineRecord

from ..conf import jobs_settings
from .models import WorkerRecord


class DatabaseRegistry:
    @property
    def heartbeat_seconds(self) -> float:
        return jobs_settings().WORKERS_HEARTBEAT_SECONDS

    def _alias(self) -> str:
        return alias_for(WorkerRecord)

    def register(
        self, record: EngineRecord, *, running: int, now: datetime, unhealthy: str = ""
    ) -> None:
        values = {
            "token": record.token,
            "host": record.host[:255],
            "pid": record.pid,
            "queues": list(record.queues),
            "concurrency": record.concurrency,
            "version": record.version[:50],
            "running": running,
            "started_at": now,
            "last_heartbeat_at": now,
            "unhealthy_since": now if unhealthy else None,
            "unhealthy_reason": unhealthy[:300],
        }
        for _ in range(3):
            try:
                with transaction.atomic(using=self._alias()):
                    WorkerRecord.objects.update_or_create(
                        kind=record.kind[:50], engine_id=record.engine_id[:300], defaults=values
                    )
                return
            except IntegrityError:
                continue  # another run of the same id inserted first: replace its row
        raise IntegrityError(f"could not record {record.kind} {record.engine_id}")

    def heartbeat(
        self, record: EngineRecord, *, running: int, now: datetime, unhealthy: str = ""
    ) -> bool:
        # An outage that goes on keeps the time it began.
        since = Coalesce(F("unhealthy_since"), Value(now)) if unhealthy else None
        with transaction.atomic(using=self._alias()):
            return bool(
                WorkerRecord.objects.filter(
                    kind=record.kind[:50], engine_id=record.engine_id[:300], token=record.token
                ).update(
                    last_heartbeat_at=now,
                    running=running,
                    unhealthy_since=since,
                    unhealthy_reason=unhealthy[:300],
                )
            )

    def remove(self, record: EngineRecord) -> None:
        with transaction.atomic(using=self._alias()):
            WorkerRecord.objects.filter(
                kind=record.kind[:50], engine_id=record.engine_id[:300], token=record.token
            ).delete()

    def clean_up(self, *, now: datetime) -> int:
        cutoff = now - timedelta(seconds=jobs_settings().WORKERS_RETENTION_SECONDS)
        with transaction.atomic(using=self._alias()):
            deleted, _ = WorkerRecord.objects.filter(last_heartbeat_at__lt=cutoff).delete()
        return deleted


def silent_after() -> timedelta:
    """How long without a heartbeat makes a worker silent."""
    s = jobs_settings()
    return timedelta(seconds=s.WORKERS_HEARTBEAT_SECONDS * s.WORKERS_SILENT_AFTER)
