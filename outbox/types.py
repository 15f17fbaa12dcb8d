"""Values that cross the outbox's boundary: statuses, envelopes, batches, outcomes."""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self

from django.db import models

from ledon.values import FencedOutcome


class MessageStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    PARKED = "parked", "Parked"


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """One integration event as stored and as handed to a transport.

    ``message_id`` is fixed when the event is added and stays the same across
    redeliveries: consumers de-duplicate on it (see :func:`outbox.inbox.consume`).
    ``attempt`` counts delivery attempts, this one included (0 before the first).
    """

    message_id: uuid.UUID
    event_type: str
    payload_json: str
    key: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    created_at: datetime
    attempt: int = 0

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """Messages claimed by one dispatcher; whoever holds ``token`` may record them."""

    token: str
    dispatcher_id: str
    lease_expires_at: datetime
    messages: tuple[Envelope, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryReport:
    """A transport's confirmation for one message: delivered, or failed with why.

    A ``permanent`` failure parks the message at once instead of retrying it.
    """

    message_id: uuid.UUID
    error: str = ""
    permanent: bool = False

    @property
    def ok(self) -> bool:
        return not self.error

    @classmethod
    def delivered(cls, message_id: uuid.UUID) -> Self:
        return cls(message_id=message_id)

    @classmethod
    def failed(cls, message_id: uuid.UUID, error: str, *, permanent: bool = False) -> Self:
        return cls(message_id=message_id, error=error or "delivery failed", permanent=permanent)


class ConsumeOutcome(enum.Enum):
    """What ``consume_events`` did with one received message."""

    HANDLED = "handled"
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"
    PARKED = "parked"
    #: The consumer stopped before the message was done; the broker delivers it again.
    ABANDONED = "abandoned"


class RecordOutcome(FencedOutcome):
    """What recording one delivery did. ``STALE`` is falsy: the batch's lease was
    lost (recovered by another dispatcher), and nothing changed."""

    SENT = "sent"
    RETRY_SCHEDULED = "retry_scheduled"
    PARKED = "parked"
    STALE = "stale"


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscardedMessage:
    """A parked message an operator discarded: deleted, never to be delivered.
    ``released_next``: it halted its key, and the key's next message goes out now."""

    message_id: uuid.UUID
    event_type: str
    key: str
    last_error: str
    released_next: bool


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """Messages of stopped dispatchers: made claimable again, or parked (attempts used)."""

    released: int = 0
    parked: int = 0

    @property
    def total(self) -> int:
        return self.released + self.parked
