"""The stored state of each schedule (``jobs_schedule``). Reads only: every state
change lives in :mod:`jobs.schedules.store`."""

from __future__ import annotations

from django.db import models

from .types import CatchUp


class Schedule(models.Model):
    """One row per schedule ever declared, keyed by its unique name.

    Rows are created from the code's declarations (by every worker at start-up and by
    ``enqueue_due_schedules``); a row whose schedule is no longer declared stays, is
    shown as orphaned and is never enqueued. ``next_run_at`` is the start of the next
    period to enqueue; ``last_period`` the start of the last one enqueued.
    """

    name = models.CharField(max_length=100)
    #: The five cron fields, or "" for an interval.
    cron = models.CharField(max_length=200, blank=True, default="")
    #: The interval in seconds, or 0 for a cron expression.
    every_seconds = models.PositiveIntegerField(default=0)
    timezone = models.CharField(max_length=64, default="UTC")
    catch_up = models.CharField(max_length=8, choices=CatchUp.choices, default=CatchUp.LATEST)
    handler = models.CharField(max_length=200)
    handler_version = models.PositiveIntegerField(default=1)
    queue = models.CharField(max_length=100, default="default")
    next_run_at = models.DateTimeField()
    last_period = models.DateTimeField(null=True, blank=True)
    last_job_id = models.CharField(max_length=200, blank=True, default="")
    last_enqueued_at = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    #: When a worker first saw the declaration: the first period starts at or after it.
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        app_label = "jobs"
        db_table = "jobs_schedule"
        constraints = [
            # The index every pass reads the rows through (name IN (…declared names)).
            models.UniqueConstraint(fields=["name"], name="jobs_schedule_name"),
            models.CheckConstraint(
                condition=models.Q(cron="", every_seconds__gt=0)
                | (~models.Q(cron="") & models.Q(every_seconds=0)),
                name="jobs_schedule_cron_xor_every",
            ),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
