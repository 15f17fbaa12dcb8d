"""At the store: every transition of outbox messages is one guarded statement with
a typed outcome — claim, record, recover, redeliver, park, retention — and claims by
concurrent dispatchers never overlap."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from outbox import IntegrationEvent, store, unit_of_work
from outbox.exceptions import InvalidInput, InvalidTransition, MessageNotFound
from outbox.inbox import consume
from outbox.models import InboxMessage, OutboxMessage
from outbox.types import DeliveryReport, Envelope, MessageStatus, RecordOutcome, RecoveryResult

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass(frozen=True)
class Pinged(IntegrationEvent, name="test.store.pinged"):
    n: int


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True, "MAX_ATTEMPTS": 3}


def stage(count: int = 1) -> list[Envelope]:
    with unit_of_work() as uow:
        return [uow.add_integration_event(Pinged(n)) for n in range(count)]


def row(envelope: Envelope) -> OutboxMessage:
    return OutboxMessage.objects.get(message_id=envelope.message_id)


def claim(dispatcher: str = "d1", limit: int = 10, **kwargs: Any) -> Any:
    return store.claim_batch(dispatcher, limit=limit, **kwargs)


def delivered(*envelopes: Envelope) -> list[DeliveryReport]:
    return [DeliveryReport.delivered(e.message_id) for e in envelopes]


class TestClaim:
    def test_claims_due_messages_in_order_with_a_lease_and_attempt(self):
        staged = stage(3)
        now = timezone.now()
        batch = claim(lease_seconds=30, now=now)
        assert [m.message_id for m in batch.messages] == [e.message_id for e in staged]
        assert [m.attempt for m in batch.messages] == [1, 1, 1]
        assert batch.messages[0].payload == {"n": 0}
        assert batch.messages[0].event_type == "test.store.pinged"
        assert batch.lease_expires_at == now + timedelta(seconds=30)
        for envelope in staged:
            message = row(envelope)
            assert message.status == MessageStatus.PENDING
            assert message.leased_by == "d1"
            assert message.lease_token == batch.token
            assert message.attempts == 1
        assert claim() is None  # all leased

    def test_limit_and_not_before_the_next_attempt_time(self):
        staged = stage(3)
        first = claim(limit=2)
        assert len(first.messages) == 2
        second = claim(limit=2)
        assert [m.message_id for m in second.messages] == [staged[2].message_id]
        assert first.token != second.token
        store.record_deliveries(
            second.token,
            [DeliveryReport.failed(staged[2].message_id, "down")],
            retry_at={staged[2].message_id: timezone.now() + timedelta(minutes=5)},
        )
        assert claim() is None
        later = claim(now=timezone.now() + timedelta(minutes=6))
        assert [m.attempt for m in later.messages] == [2]

    @pytest.mark.parametrize("limit", [0, -1, 10_001, True, "5"])
    def test_bad_limits_and_dispatcher_ids_are_refused(self, limit):
        with pytest.raises(InvalidInput):
            store.claim_batch("d1", limit=limit)
        with pytest.raises(InvalidInput):
            store.claim_batch("", limit=1)

    def test_concurrent_claimers_get_disjoint_batches(self, concurrently):
        staged = stage(60)

        def claim_all() -> list[uuid.UUID]:
            got: list[uuid.UUID] = []
            while (batch := store.claim_batch("d", limit=4)) is not None:
                got.extend(m.message_id for m in batch.messages)
            return got

        outcomes = concurrently(*[claim_all] * 4)
        assert [o.error for o in outcomes] == [None] * 4
        claimed = [m for o in outcomes for m in o.value]
        assert sorted(claimed) == sorted(e.message_id for e in staged)  # each exactly once


class TestRecord:
    def test_delivered_becomes_sent_and_the_lease_is_cleared(self):
        (envelope,) = stage()
        batch = claim()
        now = timezone.now()
        outcomes = store.record_deliveries(batch.token, delivered(envelope), retry_at={}, now=now)
        assert outcomes == {envelope.message_id: RecordOutcome.SENT}
        message = row(envelope)
        assert message.status == MessageStatus.SENT
        assert message.sent_at == now
        assert (message.lease_token, message.leased_by, message.lease_expires_at) == (
            None,
            "",
            None,
        )

    def test_a_failure_is_retried_later_then_parked_with_its_error(self):
        (envelope,) = stage()
        for attempt in (1, 2):
            batch = claim()
            retry_at = timezone.now() - timedelta(seconds=1)
            outcomes = store.record_deliveries(
                batch.token,
                [DeliveryReport.failed(envelope.message_id, f"broker down {attempt}")],
                retry_at={envelope.message_id: retry_at},
            )
            assert outcomes == {envelope.message_id: RecordOutcome.RETRY_SCHEDULED}
            message = row(envelope)
            assert message.status == MessageStatus.PENDING
            assert message.available_at == retry_at
            assert message.last_error == f"broker down {attempt}"
            assert message.lease_token is None
        batch = claim()
        assert batch.messages[0].attempt == 3  # MAX_ATTEMPTS
        outcomes = store.record_deliveries(
            batch.token, [DeliveryReport.failed(envelope.message_id, "still down")], retry_at={}
        )
        assert outcomes == {envelope.message_id: RecordOutcome.PARKED}
        message = row(envelope)
        assert (message.status, message.attempts, message.last_error) == (
            MessageStatus.PARKED,
            3,
            "still down",
        )
        assert claim(now=timezone.now() + timedelta(days=1)) is None

    def test_a_permanent_failure_parks_at_once(self):
        (envelope,) = stage()
        batch = claim()
        outcomes = store.record_deliveries(
            batch.token,
            [DeliveryReport.failed(envelope.message_id, "schema mismatch", permanent=True)],
            retry_at={},
        )
        assert outcomes == {envelope.message_id: RecordOutcome.PARKED}
        assert row(envelope).attempts == 1

    def test_a_mixed_batch_is_recorded_per_message(self):
        staged = stage(3)
        batch = claim()
        reports = [
            DeliveryReport.delivered(staged[0].message_id),
            DeliveryReport.failed(staged[1].message_id, "nack"),
            DeliveryReport.delivered(staged[2].message_id),
        ]
        outcomes = store.record_deliveries(batch.token, reports, retry_at={})
        assert [outcomes[e.message_id] for e in staged] == [
            RecordOutcome.SENT,
            RecordOutcome.RETRY_SCHEDULED,
            RecordOutcome.SENT,
        ]

    def test_a_batch_that_lost_its_lease_records_nothing(self):
        (envelope,) = stage()
        old = claim(lease_seconds=1)
        assert store.recover_expired(now=timezone.now() + timedelta(seconds=5)) == RecoveryResult(
            released=1
        )
        new = claim()
        outcomes = store.record_deliveries(old.token, delivered(envelope), retry_at={})
        assert outcomes == {envelope.message_id: RecordOutcome.STALE}
        assert not outcomes[envelope.message_id]
        message = row(envelope)
        assert (message.status, message.lease_token, message.attempts) == (
            MessageStatus.PENDING,
            new.token,
            2,
        )
        assert store.record_deliveries(new.token, delivered(envelope), retry_at={}) == {
            envelope.message_id: RecordOutcome.SENT
        }


class TestRecovery:
    def test_expired_leases_are_released_and_used_up_attempts_parked(self):
        used_up, fresh, live = stage(3)
        now = timezone.now()
        after_expiry = now + timedelta(seconds=2)
        # Dispatchers that crash mid-batch, again and again (MAX_ATTEMPTS is 3):
        store.claim_batch("gone", limit=1, lease_seconds=1, now=now)  # used_up: 1
        assert store.recover_expired(now=after_expiry) == RecoveryResult(released=1)
        store.claim_batch("gone", limit=2, lease_seconds=1, now=now)  # used_up: 2, fresh: 1
        assert store.recover_expired(now=after_expiry) == RecoveryResult(released=2)
        store.claim_batch("gone", limit=2, lease_seconds=1, now=now)  # used_up: 3, fresh: 2
        store.claim_batch("alive", limit=1, lease_seconds=300, now=now)
        result = store.recover_expired(now=after_expiry)
        assert result == RecoveryResult(released=1, parked=1)
        assert row(fresh).status == MessageStatus.PENDING
        assert row(fresh).lease_token is None
        parked = row(used_up)
        assert parked.status == MessageStatus.PARKED
        assert "dispatcher stopped" in parked.last_error
        assert row(live).leased_by == "alive"

    def test_a_restarted_dispatcher_releases_its_own_leases_at_once(self):
        mine, theirs = stage(2)
        store.claim_batch("me", limit=1, lease_seconds=300)
        store.claim_batch("them", limit=1, lease_seconds=300)
        assert store.recover_dispatcher("me") == RecoveryResult(released=1)
        assert row(mine).lease_token is None
        assert row(theirs).leased_by == "them"


class TestOperators:
    def test_redeliver_a_parked_message_with_fresh_attempts(self):
        (envelope,) = stage()
        batch = claim()
        store.record_deliveries(
            batch.token,
            [DeliveryReport.failed(envelope.message_id, "bad", permanent=True)],
            retry_at={},
        )
        now = timezone.now()
        store.redeliver(envelope.message_id, now=now)
        message = row(envelope)
        assert (message.status, message.attempts, message.available_at) == (
            MessageStatus.PENDING,
            0,
            now,
        )
        assert message.last_error == "bad"  # kept for the record until the next attempt

    def test_redeliver_a_message_waiting_for_its_retry_now(self):
        (envelope,) = stage()
        batch = claim()
        store.record_deliveries(
            batch.token,
            [DeliveryReport.failed(envelope.message_id, "down")],
            retry_at={envelope.message_id: timezone.now() + timedelta(hours=1)},
        )
        store.redeliver(envelope.message_id)
        assert claim().messages[0].attempt == 2

    def test_refusals_say_why_and_change_nothing(self):
        sent, leased, pending = stage(3)
        batch = claim(limit=1)
        store.record_deliveries(batch.token, delivered(sent), retry_at={})
        claim(limit=1)
        before = list(OutboxMessage.objects.order_by("id").values())
        with pytest.raises(InvalidTransition, match="is sent"):
            store.redeliver(sent.message_id)
        with pytest.raises(InvalidTransition, match="being delivered"):
            store.redeliver(leased.message_id)
        with pytest.raises(InvalidTransition, match="being delivered"):
            store.park(leased.message_id, "stop")
        with pytest.raises(InvalidTransition, match="is sent"):
            store.park(sent.message_id, "stop")
        with pytest.raises(MessageNotFound):
            store.redeliver(uuid.uuid4())
        assert list(OutboxMessage.objects.order_by("id").values()) == before
        store.park(pending.message_id, "parked by hand")
        assert row(pending).status == MessageStatus.PARKED
        with pytest.raises(InvalidTransition, match="is parked"):
            store.park(pending.message_id, "again")


class TestRetention:
    def test_purges_only_sent_messages_older_than_the_cutoff(self):
        old, recent, pending = stage(3)
        batch = claim(limit=2)
        store.record_deliveries(
            batch.token, delivered(old), retry_at={}, now=timezone.now() - timedelta(days=8)
        )
        store.record_deliveries(batch.token, delivered(recent), retry_at={})
        cutoff = timezone.now() - timedelta(days=7)
        assert store.purge_sent(older_than=cutoff, limit=10) == 1
        assert set(OutboxMessage.objects.values_list("message_id", flat=True)) == {
            recent.message_id,
            pending.message_id,
        }

    def test_purges_inbox_records_in_limited_chunks(self):
        for n in range(5):
            with unit_of_work(), consume("billing", f"m-{n}"):
                pass
        later = timezone.now() + timedelta(seconds=1)
        assert store.purge_inbox(older_than=later, limit=2) == 2
        assert store.purge_inbox(older_than=later, limit=10) == 3
        assert not InboxMessage.objects.exists()


@pytest.mark.postgres_only
class TestPlans:
    @pytest.fixture
    def history(self) -> None:
        now = timezone.now()
        OutboxMessage.objects.bulk_create(
            OutboxMessage(
                message_id=uuid.uuid4(),
                event_type="test.store.pinged",
                payload_json="{}",
                status=MessageStatus.SENT if n % 50 else MessageStatus.PENDING,
                available_at=now,
                created_at=now,
                updated_at=now,
                sent_at=now if n % 50 else None,
            )
            for n in range(20_000)
        )
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {OutboxMessage._meta.db_table}")

    def test_claim_statement_uses_the_due_index(self, history: None) -> None:
        now = timezone.now()
        params: list[object] = ["d1", "t", now, now, "pending", False, now, 10]
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {store.claim_sql(connection.vendor)}", params)
            plan = "\n".join(r[0] for r in cursor.fetchall())
        assert "outbox_msg_due_idx" in plan, plan


@pytest.mark.postgres_only
def test_a_claim_picks_its_rows_once_whatever_the_plan():
    """One claim takes at most ``limit`` messages. Its pick (``LIMIT … FOR UPDATE
    SKIP LOCKED``) is an init plan, run once per statement: as an ``IN`` sub-select
    the planner may run it again for each outer row, each run skipping the rows the
    update has changed so far and picking ``limit`` more."""
    stage(25)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN " + store.claim_sql(connection.vendor),
            ["d1", "t", now, now, MessageStatus.PENDING, False, now, 10],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "InitPlan" in plan, plan
    assert "Semi Join" not in plan, plan
    batch = claim(limit=10)
    assert len(batch.messages) == 10
    assert OutboxMessage.objects.filter(lease_token__isnull=False).count() == 10
