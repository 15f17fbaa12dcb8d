"""The workers registry's table (``jobs_workerrecord``) and the dashboard's admin
entry. Reads only: rows are written by :mod:`jobs.observability.worker_registry`."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models


class WorkerRecordQuerySet(models.QuerySet["WorkerRecord"]):
    def live(self, now: datetime, silent_after: timedelta) -> WorkerRecordQuerySet:
        """Rows whose last heartbeat is more recent than ``silent_after``."""
        return self.filter(last_heartbeat_at__gte=now - silent_after)

    def silent(self, now: datetime, silent_after: timedelta) -> WorkerRecordQuerySet:
        return self.filter(last_heartbeat_at__lt=now - silent_after)


class WorkerRecord(models.Model):
    """One running engine (job worker, dispatcher, consumer, saga runner): who it is
    and its last heartbeat. A clean exit deletes the row; a killed process leaves it
    to grow silent until retention deletes it."""

    kind = models.CharField(max_length=50)
    engine_id = models.CharField(max_length=300, verbose_name="id")
    #: Which run of this kind and id the row belongs to.
    token = models.CharField(max_length=64)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, blank=True)
    concurrency = models.PositiveIntegerField(default=1)
    version = models.CharField(max_length=50, blank=True, default="")
    running = models.PositiveIntegerField(default=0, help_text="Work held at the last heartbeat.")
    started_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()
    #: Since when the engine said at its heartbeats that it does not work (its own
    #: database steps fail), and why; null while it works.
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    unhealthy_reason = models.CharField(max_length=300, blank=True, default="")

    objects = WorkerRecordQuerySet.as_manager()

    class Meta:
        verbose_name = "worker"
        constraints = [
            models.UniqueConstraint(fields=["kind", "engine_id"], name="jobs_worker_identity"),
        ]
        indexes = [models.Index(fields=["last_heartbeat_at"], name="jobs_worker_heartbeat_idx")]
        ordering = ["kind", "engine_id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.engine_id}"


class Dashboard(WorkerRecord):
    """The admin's dashboard page (no table of its own: its list is the dashboard)."""

    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "dashboard"
