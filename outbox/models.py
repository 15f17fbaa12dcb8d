"""Tables of the outbox app. Reads only: every state change lives in ``outbox/store.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.db.models import Q

from .types import MessageStatus

#: The statuses of a message not delivered yet: they hold back the later messages of
#: their key.
UNSENT = (MessageStatus.PENDING, MessageStatus.PARKED)

if TYPE_CHECKING:
    from datetime import datetime


class OutboxMessageQuerySet(models.QuerySet["OutboxMessage"]):
    def pending(self) -> OutboxMessageQuerySet:
        return self.filter(status=MessageStatus.PENDING)

    def sent(self) -> OutboxMessageQuerySet:
        return self.filter(status=MessageStatus.SENT)

    def parked(self) -> OutboxMessageQuerySet:
        return self.filter(status=MessageStatus.PARKED)

    def due(self, now: datetime) -> OutboxMessageQuerySet:
        """Claimable now: Pending, not leased, not held behind an earlier message of its
        key, next attempt time reached."""
        return self.filter(
            status=MessageStatus.PENDING,
            lease_token__isnull=True,
            held=False,
            available_at__lte=now,
        )

    def parked_without_key(self) -> OutboxMessageQuerySet:
        """Parked messages retention may delete: a keyed one halts its key's later
        messages and waits for an operator to redeliver or discard it."""
        return self.parked().filter(key="")

    def unsent(self) -> OutboxMessageQuerySet:
        """Pending or Parked: not delivered yet. A keyed message is claimed only while
        it is the first unsent message of its key."""
        return self.filter(status__in=UNSENT)

    def halting(self) -> OutboxMessageQuerySet:
        """Parked messages that halt their key: the first unsent message of a key is
        parked, so the key's later messages wait until it is redelivered or discarded."""
        return self.parked().exclude(key="").filter(held=False)

    def held(self) -> OutboxMessageQuerySet:
        """Messages waiting behind an earlier unsent message of their key."""
        return self.filter(held=True)

    def leased(self) -> OutboxMessageQuerySet:
        """Claimed by a dispatcher and not yet recorded as delivered or failed."""
        return self.filter(status=MessageStatus.PENDING, lease_token__isnull=False)

    def lease_expired(self, now: datetime) -> OutboxMessageQuerySet:
        return self.leased().filter(lease_expires_at__lt=now)


class OutboxMessage(models.Model):
    """One integration event waiting for, or done with, delivery.

    ``message_id`` is the identity consumers see; it never changes, so a redelivery
    carries the same id. The surrogate ``id`` orders claims and serves the admin.
    """

    message_id = models.UUIDField(unique=True, editable=False)
    event_type = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="")
    payload_json = models.TextField()
    headers = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=16, choices=MessageStatus.choices, default=MessageStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    #: The next attempt's earliest time (the backoff after a failure).
    available_at = models.DateTimeField()
    #: True while an earlier message with the same ``key`` is unsent (Pending or
    #: Parked): the message waits, out of the claim's index, until that one is sent or
    #: discarded. Keyless messages are never held.
    held = models.BooleanField(default=False)
    #: True once a message of the same ``key`` was stored behind this one while it was
    #: unsent: its delivery then releases the key's next message. A message is stored
    #: False; a row written any other way (by older code) is True, which costs its
    #: delivery one look for a next message and never leaves one held.
    followed = models.BooleanField(default=True, db_default=True)
    last_error = models.TextField(blank=True, default="")
    leased_by = models.CharField(max_length=200, blank=True, default="")
    # NULL, not "": the claim index covers only rows without a lease.
    lease_token = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)

    objects = OutboxMessageQuerySet.as_manager()

    class Meta:
        verbose_name = "outbox message"
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=MessageStatus.values), name="outbox_message_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(lease_token__isnull=True) | Q(status=MessageStatus.PENDING),
                name="outbox_message_lease_only_pending",
            ),
        ]
        indexes = [
            # The claim query's index: only claimable candidates are in it, so sent
            # history never slows dispatching down.
            models.Index(
                fields=["available_at", "id"],
                name="outbox_msg_due_idx",
                condition=Q(status="pending", lease_token__isnull=True, held=False),
            ),
            # Each key's unsent messages in stored order: where a new message finds
            # whether it must wait.
            models.Index(
                fields=["key", "id"],
                name="outbox_msg_key_idx",
                condition=Q(status__in=["pending", "parked"]) & ~Q(key=""),
            ),
            # Each key's held messages in stored order: where the end of a key's first
            # message finds the next to release. Empty while no key has a backlog, so
            # that the probe costs next to nothing then.
            models.Index(fields=["key", "id"], name="outbox_msg_held_idx", condition=Q(held=True)),
            models.Index(
                fields=["lease_expires_at"],
                name="outbox_msg_leased_idx",
                condition=Q(status="pending", lease_token__isnull=False),
            ),
            models.Index(
                fields=["sent_at"], name="outbox_msg_sent_idx", condition=Q(status="sent")
            ),
            models.Index(fields=["status", "event_type"], name="outbox_msg_status_type_idx"),
            models.Index(fields=["created_at"], name="outbox_msg_created_idx"),
        ]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.event_type} {self.message_id} ({self.status})"


class InboxMessage(models.Model):
    """A message one consumer has processed; (consumer, message_id) is unique.

    The row is written in the consumer's transaction, so it exists if and only if the
    consumer's work committed: a redelivery finds it and is skipped.
    """

    consumer = models.CharField(max_length=100)
    message_id = models.CharField(max_length=200)
    processed_at = models.DateTimeField()

    class Meta:
        verbose_name = "inbox message"
        constraints = [
            models.UniqueConstraint(
                fields=["consumer", "message_id"], name="outbox_inbox_identity"
            ),
        ]
        indexes = [models.Index(fields=["processed_at"], name="outbox_inbox_processed_idx")]
        ordering = ["-processed_at", "-id"]

    def __str__(self) -> str:
        return f"{self.consumer}: {self.message_id}"
