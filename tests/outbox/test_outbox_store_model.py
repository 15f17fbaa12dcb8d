"""The outbox store against a model of key order: random sequences of every transition
— store (keyed and keyless, several per transaction), claim by two dispatchers,
record (delivered, failed for a retry, failed for good, with current and lost
leases), lease expiry and recovery, redeliver, park, discard, retention — checked
after every step against a plain-Python model (Hypothesis stateful testing), on
SQLite and PostgreSQL.

The model does not say which message is held: it derives it. After every step each
message's status, lease and attempts match the model, and for every key its first
unsent message is the only one not held, no two of its messages are leased at once,
and its messages were sent in the order they were stored.

``LEDON_MODEL_EXAMPLES=300`` runs a long profile (see tests/jobs/test_store_model.py).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from outbox import IntegrationEvent, store, unit_of_work
from outbox.exceptions import InvalidTransition
from outbox.models import OutboxMessage
from outbox.types import Batch, DeliveryReport, RecordOutcome

KEYS = ["a", "b", ""]
SHORT = {"sqlite": 60, "postgresql": 30}
EXAMPLES = int(os.environ.get("LEDON_MODEL_EXAMPLES", "0"))
STEPS = int(os.environ.get("LEDON_MODEL_STEPS", "30"))
LEASE = 30
MAX_ATTEMPTS = 3

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(max(120, EXAMPLES * STEPS // 2)),
]


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True, "MAX_ATTEMPTS": MAX_ATTEMPTS}


@dataclass(frozen=True)
class Noted(IntegrationEvent, name="test.model.noted"):
    n: int


@dataclass
class ModelMessage:
    message_id: uuid.UUID
    key: str
    order: int
    status: str = "pending"
    token: str | None = None
    lease_until: datetime | None = None
    attempts: int = 0
    available_at: datetime = field(default_factory=timezone.now)

    @property
    def unsent(self) -> bool:
        return self.status in ("pending", "parked")


class OutboxStoreModel(RuleBasedStateMachine):
    batches = Bundle("batches")

    def __init__(self) -> None:
        super().__init__()
        self.messages: dict[uuid.UUID, ModelMessage] = {}
        self.sent_order: dict[str, list[int]] = {}
        # Ahead of the wall clock: a message stored "now" is due.
        self.now = timezone.now() + timedelta(days=1)
        self.stored = 0

    @initialize()
    def empty_outbox(self) -> None:
        OutboxMessage.objects.all().delete()

    # ------------------------------------------------------------------ the model's view

    def held(self, message: ModelMessage) -> bool:
        """Held: an earlier message of its key is unsent."""
        return bool(message.key) and any(
            m.key == message.key and m.unsent and m.order < message.order
            for m in self.messages.values()
        )

    def claimable(self) -> list[ModelMessage]:
        due = [
            m
            for m in self.messages.values()
            if m.status == "pending"
            and m.token is None
            and not self.held(m)
            and m.available_at <= self.now
        ]
        return sorted(due, key=lambda m: (m.available_at, m.order))

    # ------------------------------------------------------------------ rules

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3))
    def store_messages(self, keys: list[str]) -> None:
        with unit_of_work() as uow:
            envelopes = [uow.add_integration_event(Noted(n), key=k) for n, k in enumerate(keys)]
        for envelope in envelopes:
            self.stored += 1
            self.messages[envelope.message_id] = ModelMessage(
                envelope.message_id, envelope.key, self.stored, available_at=envelope.created_at
            )

    @rule(target=batches, dispatcher=st.sampled_from(["d1", "d2"]), limit=st.integers(1, 3))
    def claim(self, dispatcher: str, limit: int) -> Batch | None:
        expected = self.claimable()[:limit]
        batch = store.claim_batch(dispatcher, limit=limit, lease_seconds=LEASE, now=self.now)
        got = [] if batch is None else [m.message_id for m in batch.messages]
        assert sorted(got) == sorted(m.message_id for m in expected)
        if batch is not None:
            for message in expected:
                message.token = batch.token
                message.lease_until = self.now + timedelta(seconds=LEASE)
                message.attempts += 1
        return batch

    @rule(
        batch=batches,
        outcomes=st.lists(st.sampled_from(["ok", "retry", "later", "poison"]), min_size=3),
    )
    def record(self, batch: Batch | None, outcomes: list[str]) -> None:
        if batch is None:
            return
        reports, retry_at = [], {}
        for envelope, outcome in zip(batch.messages, outcomes, strict=False):
            if outcome == "ok":
                reports.append(DeliveryReport.delivered(envelope.message_id))
            else:
                reports.append(
                    DeliveryReport.failed(envelope.message_id, "no", permanent=outcome == "poison")
                )
                delay = 60 if outcome == "later" else 0
                retry_at[envelope.message_id] = self.now + timedelta(seconds=delay)
        got = store.record_deliveries(
            batch.token, reports, retry_at=retry_at, max_attempts=MAX_ATTEMPTS, now=self.now
        )
        for report in reports:
            message = self.messages.get(report.message_id)
            if message is None or message.token != batch.token:  # purged, or lease lost
                assert got[report.message_id] is RecordOutcome.STALE
                continue
            message.token = message.lease_until = None
            if report.ok:
                assert got[report.message_id] is RecordOutcome.SENT
                message.status = "sent"
                self.sent_order.setdefault(message.key, []).append(message.order)
            elif report.permanent or message.attempts >= MAX_ATTEMPTS:
                assert got[report.message_id] is RecordOutcome.PARKED
                message.status = "parked"
            else:
                assert got[report.message_id] is RecordOutcome.RETRY_SCHEDULED
                message.available_at = retry_at[report.message_id]

    @rule(seconds=st.sampled_from([10, 45, 90]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def recover_expired(self) -> None:
        result = store.recover_expired(now=self.now)
        released = parked = 0
        for message in self.messages.values():
            if message.token is not None and message.lease_until < self.now:
                message.token = message.lease_until = None
                if message.attempts >= MAX_ATTEMPTS:
                    message.status = "parked"
                    parked += 1
                else:
                    released += 1
        assert (result.released, result.parked) == (released, parked)

    @rule(
        data=st.data(),
        action=st.sampled_from(["redeliver", "park", "discard"]),
        parked_only=st.booleans(),
    )
    def operator(self, data: Any, action: str, parked_only: bool) -> None:
        """An operator's action on any message, or (``parked_only``) on a parked one,
        the kind that halts keys."""
        # In stored order: message ids are random, the order is the same on a replay.
        every = sorted(self.messages.values(), key=lambda m: m.order)
        parked = [m for m in every if m.status == "parked"]
        candidates = parked if parked_only and parked else every
        if not candidates:
            return
        message = data.draw(st.sampled_from(candidates))
        allowed = message.token is None and (
            {"redeliver": message.unsent, "park": message.status == "pending"}.get(
                action, message.status == "parked"
            )
        )
        try:
            if action == "redeliver":
                store.redeliver(message.message_id, now=self.now)
            elif action == "park":
                store.park(message.message_id, "by the model", now=self.now)
            else:
                store.discard(message.message_id, now=self.now)
        except InvalidTransition:
            assert not allowed
            return
        assert allowed
        if action == "redeliver":
            if message.status == "parked":
                message.attempts = 0
            message.status, message.available_at = "pending", self.now
        elif action == "park":
            message.status = "parked"
        else:
            del self.messages[message.message_id]

    @rule()
    def retention(self) -> None:
        purged = store.purge_parked(older_than=self.now + timedelta(days=30))
        gone = [m for m in self.messages.values() if m.status == "parked" and not m.key]
        assert purged == len(gone)
        for message in gone:
            del self.messages[message.message_id]

    # ------------------------------------------------------------------ invariants

    @invariant()
    def the_store_matches_the_model(self) -> None:
        rows = {r.message_id: r for r in OutboxMessage.objects.all()}
        assert set(rows) == set(self.messages)
        for message_id, message in self.messages.items():
            row = rows[message_id]
            assert (row.status, row.lease_token, row.attempts) == (
                message.status,
                message.token,
                message.attempts,
            )
            assert row.held == (message.unsent and self.held(message)), message

    @invariant()
    def each_key_is_in_flight_once_and_sent_in_order(self) -> None:
        for key in KEYS[:2]:
            leased = [m for m in self.messages.values() if m.key == key and m.token]
            assert len(leased) <= 1
            assert self.sent_order.get(key, []) == sorted(self.sent_order.get(key, []))


def test_the_outbox_store_follows_its_model() -> None:
    run_state_machine_as_test(
        OutboxStoreModel,
        settings=settings(
            max_examples=EXAMPLES or SHORT[connection.vendor],
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
