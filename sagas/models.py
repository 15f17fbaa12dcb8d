"""The table of the sagas app. Reads only: every state change lives in
``sagas/store.py``."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from django.db import models
from django.db.models import Q

from .types import ACTIVE_STATUSES, SagaStatus

if TYPE_CHECKING:
    from datetime import datetime


def lease_free_at(now: datetime) -> Q:
    """Not leased, or leased until a moment that has passed (the condition of
    :meth:`SagaInstanceQuerySet.lease_free`, for counts and guards)."""
    return Q(leased_until__isnull=True) | Q(leased_until__lt=now)


class SagaInstanceQuerySet(models.QuerySet["SagaInstance"]):
    def active(self) -> SagaInstanceQuerySet:
        return self.filter(status__in=ACTIVE_STATUSES)

    def needs_attention(self) -> SagaInstanceQuerySet:
        return self.filter(status=SagaStatus.FAILED)

    def finished(self) -> SagaInstanceQuerySet:
        return self.filter(status__in=(SagaStatus.SUCCEEDED, SagaStatus.COMPENSATED))

    def lease_free(self, now: datetime) -> SagaInstanceQuerySet:
        """Not leased, or leased until a moment that has passed."""
        return self.filter(lease_free_at(now))

    def claimable(self, now: datetime) -> SagaInstanceQuerySet:
        """Instances a runner may take over now: active, lease free or expired."""
        return self.active().lease_free(now)


class SagaInstance(models.Model):
    """One run of a saga: its plan (step names), progress, data, status and lease.

    ``version`` grows with every change but a lease renewal. Every write is guarded by
    the version its writer read, so the later of two concurrent writers fails
    (:class:`~sagas.exceptions.SagaConcurrencyError`) instead of overwriting the
    other's completed steps. Rows are written only through :mod:`sagas.store`.
    """

    instance_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200)
    # NULL, not "": only runs that have a key are unique per (name, key).
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    steps = models.JSONField(default=list, help_text="The step names, in order, at start.")
    completed_steps = models.JSONField(default=list)
    compensated_steps = models.JSONField(default=list)
    uncompensated_steps = models.JSONField(
        default=list,
        help_text="Completed steps that define no compensation: their effects remain.",
    )
    data = models.JSONField(default=dict)
    #: SHA-256 of the data the instance was started with (steps change ``data``): a
    #: request repeating the idempotency key must bring the same.
    request_digest = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(max_length=16, choices=SagaStatus.choices, default=SagaStatus.RUNNING)
    failed_step = models.CharField(max_length=100, blank=True, default="")
    error = models.TextField(blank=True, default="")
    compensation_error = models.TextField(blank=True, default="")
    leased_by = models.CharField(max_length=200, blank=True, default="")
    leased_until = models.DateTimeField(null=True, blank=True)
    version = models.PositiveBigIntegerField(default=0)
    #: Times a runner took the instance over from one whose lease had expired (its
    #: process died or hung) since the instance last moved on; see MAX_TAKEOVERS.
    takeovers = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = SagaInstanceQuerySet.as_manager()

    class Meta:
        verbose_name = "saga instance"
        constraints = [
            models.UniqueConstraint(
                fields=["name", "idempotency_key"], name="sagas_instance_idempotency"
            ),
        ]
        indexes = [
            models.Index(
                fields=["leased_until"],
                condition=Q(status__in=["running", "compensating"]),
                name="sagas_instance_claimable",
            ),
            models.Index(fields=["status", "name"], name="sagas_instance_status"),
            # Retention reads finished instances oldest first, never the active ones.
            models.Index(
                fields=["finished_at"],
                condition=Q(status__in=["succeeded", "compensated"]),
                name="sagas_instance_finished",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.instance_id}"
