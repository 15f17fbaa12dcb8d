"""Values that cross the boundary of the sagas app: statuses and snapshots. All are
immutable."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models


class SagaStatus(models.TextChoices):
    """Every state a saga instance can be in; ``docs/sagas.md`` lists the transitions."""

    RUNNING = "running", "Running"
    COMPENSATING = "compensating", "Compensating"
    SUCCEEDED = "succeeded", "Succeeded"
    COMPENSATED = "compensated", "Compensated"
    FAILED = "failed", "Failed (needs attention)"

    @property
    def is_active(self) -> bool:
        """A runner still has work to do: steps to run or to compensate."""
        return self in ACTIVE_STATUSES

    @property
    def is_finished(self) -> bool:
        return self in (SagaStatus.SUCCEEDED, SagaStatus.COMPENSATED)

    @property
    def needs_attention(self) -> bool:
        return self is SagaStatus.FAILED


#: States a runner drives; only these can be claimed.
ACTIVE_STATUSES = (SagaStatus.RUNNING, SagaStatus.COMPENSATING)


@dataclass(frozen=True, slots=True, kw_only=True)
class SagaSnapshot:
    """One saga instance as stored, at the moment it was read.

    ``data`` is a fresh copy: changing it changes nothing stored.
    """

    instance_id: uuid.UUID
    name: str
    status: SagaStatus
    data: dict[str, Any]
    steps: tuple[str, ...]
    completed_steps: tuple[str, ...]
    compensated_steps: tuple[str, ...]
    #: Completed steps that define no compensation: their effects remain.
    uncompensated_steps: tuple[str, ...]
    idempotency_key: str | None
    failed_step: str
    error: str
    compensation_error: str
    leased_by: str
    leased_until: datetime | None
    version: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    #: Takeovers from an expired lease since the instance last moved on.
    takeovers: int = 0
    #: True when this call created the instance (``run_saga``/``start_saga``).
    created: bool = False

    @property
    def pending_steps(self) -> tuple[str, ...]:
        """Steps not completed yet, in order."""
        return tuple(s for s in self.steps if s not in self.completed_steps)

    @property
    def steps_to_compensate(self) -> tuple[str, ...]:
        """Completed steps not yet compensated (nor skipped), latest first."""
        done = set(self.compensated_steps) | set(self.uncompensated_steps)
        return tuple(s for s in reversed(self.completed_steps) if s not in done)
