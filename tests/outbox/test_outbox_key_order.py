"""At the store: messages with one key go out one at a time, in the order they were
stored, whatever fails and whoever claims — retries, parking, redelivery, discard,
lease recovery, retention, concurrent claimers — while keyless messages and other keys
never wait for them. On PostgreSQL, the races between a transaction storing a key's
message and a dispatcher recording the key's previous one are played out with real
connections."""

from __future__ import annotations

import importlib
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox import IntegrationEvent, store, unit_of_work
from outbox.dispatcher import Dispatcher
from outbox.exceptions import InvalidTransition, MessageNotFound
from outbox.models import OutboxMessage
from outbox.testing import RecordingTransport, fault_at
from outbox.types import Batch, DeliveryReport, Envelope, MessageStatus, RecordOutcome

pytestmark = pytest.mark.django_db(transaction=True)

#: The upgrade's data step (a migration module's name is not an identifier).
hold_later_messages_of_each_key = importlib.import_module(
    "outbox.migrations.0002_key_order"
).hold_later_messages_of_each_key


@dataclass(frozen=True)
class Step(IntegrationEvent, name="test.key_order.step"):
    n: int


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True, "MAX_ATTEMPTS": 3}


def stage(*keys: str) -> list[Envelope]:
    """One message per key given (``""``: keyless), in one transaction, in order."""
    with unit_of_work() as uow:
        return [uow.add_integration_event(Step(n), key=key) for n, key in enumerate(keys)]


def claim(limit: int = 10, **kwargs: Any) -> Batch | None:
    return store.claim_batch("d1", limit=limit, **kwargs)


def claimed(limit: int = 10, **kwargs: Any) -> list[uuid.UUID]:
    batch = claim(limit, **kwargs)
    return [] if batch is None else [m.message_id for m in batch.messages]


def ids(*envelopes: Envelope) -> list[uuid.UUID]:
    return [e.message_id for e in envelopes]


def deliver(batch: Batch | None) -> dict[uuid.UUID, RecordOutcome]:
    assert batch is not None
    reports = [DeliveryReport.delivered(m.message_id) for m in batch.messages]
    return store.record_deliveries(batch.token, reports, retry_at={})


def fail(batch: Batch | None, *, later: timedelta = timedelta(0), permanent: bool = False) -> None:
    assert batch is not None
    retry_at = {m.message_id: timezone.now() + later for m in batch.messages}
    reports = [
        DeliveryReport.failed(m.message_id, "broker said no", permanent=permanent)
        for m in batch.messages
    ]
    store.record_deliveries(batch.token, reports, retry_at=retry_at)


def row(envelope: Envelope) -> OutboxMessage:
    return OutboxMessage.objects.get(message_id=envelope.message_id)


def held(*envelopes: Envelope) -> list[bool]:
    return [row(e).held for e in envelopes]


def drain(limit: int = 10) -> list[uuid.UUID]:
    """Claim and deliver until nothing is due; every message in claim order."""
    out: list[uuid.UUID] = []
    while (batch := claim(limit)) is not None:
        out.extend(m.message_id for m in batch.messages)
        deliver(batch)
    return out


class TestOneAtATimeInStoredOrder:
    def test_a_batch_takes_only_the_first_unsent_message_of_each_key(self):
        a1, b1, a2, none1, b2, a3, none2 = stage("a", "b", "a", "", "b", "a", "")
        assert held(a1, b1, a2, none1, b2, a3, none2) == [
            False,
            False,
            True,
            False,
            True,
            True,
            False,
        ]
        batch = claim()
        assert [m.message_id for m in batch.messages] == ids(a1, b1, none1, none2)
        assert claim() is None  # a2 and b2 wait for a1 and b1, leased meanwhile

    def test_each_key_goes_out_in_stored_order_across_batches(self):
        staged = stage(*["a", "b", "c"] * 4)
        order = drain(limit=2)
        assert sorted(order) == sorted(ids(*staged))
        for key in "abc":
            mine = [e.message_id for e in staged if e.key == key]
            assert [m for m in order if m in mine] == mine

    def test_stored_order_spans_transactions(self):
        (first,) = stage("a")
        (second,) = stage("a")
        (third,) = stage("a")
        assert drain(limit=1) == ids(first, second, third)

    def test_a_message_stored_after_its_key_went_out_is_not_held(self):
        (_first,) = stage("a")
        deliver(claim())
        (second,) = stage("a")
        assert held(second) == [False]
        assert claimed() == ids(second)

    def test_concurrent_claimers_never_hold_two_messages_of_one_key(self, concurrently):
        staged = stage(*[f"k{n % 5}" for n in range(40)])

        def claim_and_deliver() -> None:
            while OutboxMessage.objects.unsent().exists():
                batch = store.claim_batch("d", limit=3)
                if batch is None:
                    continue  # every key's first message is leased to another thread
                keys = [m.key for m in batch.messages]
                assert len(keys) == len(set(keys))
                # No other batch holds a message of these keys meanwhile.
                assert OutboxMessage.objects.leased().filter(key__in=keys).count() == len(keys)
                deliver(batch)

        outcomes = concurrently(*[claim_and_deliver] * 3)
        assert [o.error for o in outcomes] == [None] * 3
        assert OutboxMessage.objects.sent().count() == 40
        for key in {e.key for e in staged}:
            by_sending = OutboxMessage.objects.sent().filter(key=key).order_by("sent_at", "id")
            assert list(by_sending.values_list("message_id", flat=True)) == [
                e.message_id for e in staged if e.key == key
            ]


class TestHeldKeys:
    def test_a_message_waiting_for_its_retry_holds_its_key(self):
        a1, _a2, b1 = stage("a", "a", "b")
        batch = claim()
        assert [m.message_id for m in batch.messages] == ids(a1, b1)
        fail(batch, later=timedelta(minutes=5))
        assert OutboxMessage.objects.get(message_id=b1.message_id).status == "pending"
        # Long after a2 was stored, a1 is still waiting for its retry: a2 waits too.
        assert claimed(now=timezone.now() + timedelta(minutes=1)) == []
        assert claimed(now=timezone.now() + timedelta(minutes=6)) == ids(a1, b1)

    def test_a_failed_retry_keeps_its_place_then_the_key_moves_on(self):
        _a1, a2 = stage("a", "a")
        fail(claim())
        batch = claim()
        assert [m.attempt for m in batch.messages] == [2]
        deliver(batch)
        assert claimed() == ids(a2)

    def test_a_parked_message_halts_its_key_and_redelivery_resumes_it(self):
        a1, a2, a3, b1, none = stage("a", "a", "a", "b", "")
        fail(claim(limit=1), permanent=True)  # a1
        assert row(a1).status == MessageStatus.PARKED
        assert list(OutboxMessage.objects.halting()) == [row(a1)]
        # The rest flows: other keys and keyless messages never wait for a halted key.
        assert drain() == ids(b1, none)
        assert held(a2, a3) == [True, True]
        assert claim(now=timezone.now() + timedelta(days=365)) is None
        store.redeliver(a1.message_id)
        assert not OutboxMessage.objects.halting().exists()
        assert drain() == ids(a1, a2, a3)

    def test_discarding_a_parked_message_releases_its_key(self):
        a1, a2, a3 = stage("a", "a", "a")
        fail(claim(), permanent=True)
        discarded = store.discard(a1.message_id)
        assert discarded.released_next
        assert (discarded.key, discarded.event_type, discarded.last_error) == (
            "a",
            "test.key_order.step",
            "broker said no",
        )
        assert not OutboxMessage.objects.filter(message_id=a1.message_id).exists()
        assert drain(limit=1) == ids(a2, a3)

    def test_discarding_a_held_parked_message_leaves_the_head_alone(self):
        a1, a2, a3 = stage("a", "a", "a")
        store.park(a2.message_id, "not this one")
        discarded = store.discard(a2.message_id)
        assert not discarded.released_next
        assert held(a1, a3) == [False, True]
        assert drain(limit=1) == ids(a1, a3)

    def test_parking_a_held_message_halts_the_key_once_it_comes_first(self):
        _a1, a2, a3 = stage("a", "a", "a")
        store.park(a2.message_id, "hold it")
        deliver(claim())  # a1
        assert held(a2, a3) == [False, True]
        assert list(OutboxMessage.objects.halting()) == [row(a2)]
        assert claim() is None
        store.redeliver(a2.message_id)
        assert drain(limit=1) == ids(a2, a3)

    def test_redelivering_a_held_message_keeps_it_in_line(self):
        a1, a2 = stage("a", "a")
        store.redeliver(a2.message_id)
        assert held(a2) == [True]
        assert claimed() == ids(a1)

    def test_a_recovered_lease_keeps_the_key_held(self):
        a1, a2 = stage("a", "a")
        claim(lease_seconds=1)
        assert store.recover_expired(now=timezone.now() + timedelta(seconds=5)).released == 1
        assert held(a1, a2) == [False, True]
        assert claimed() == ids(a1)

    def test_a_keyless_message_is_never_held(self):
        staged = stage("", "", "")
        fail(claim(limit=1), permanent=True)
        assert held(*staged) == [False, False, False]
        assert drain() == ids(*staged[1:])


class TestDiscardRefusals:
    def test_only_a_parked_message_can_be_discarded_and_a_refusal_changes_nothing(self):
        sent, leased, pending = stage("a", "b", "c")
        deliver(claim(limit=1))
        claim(limit=1)
        before = list(OutboxMessage.objects.order_by("id").values())
        with pytest.raises(InvalidTransition, match="is sent"):
            store.discard(sent.message_id)
        with pytest.raises(InvalidTransition, match="being delivered"):
            store.discard(leased.message_id)
        with pytest.raises(InvalidTransition, match="is pending"):
            store.discard(pending.message_id)
        with pytest.raises(MessageNotFound):
            store.discard(uuid.uuid4())
        assert list(OutboxMessage.objects.order_by("id").values()) == before


class TestRetention:
    def test_keyed_parked_messages_are_kept_for_an_operator(self):
        keyed, _keyless = stage("a", "")
        fail(claim(), permanent=True)
        later = timezone.now() + timedelta(days=365)
        assert store.purge_parked(older_than=later) == 1
        assert list(OutboxMessage.objects.values_list("message_id", flat=True)) == ids(keyed)

    def test_purging_sent_messages_changes_no_key(self):
        _a1, a2 = stage("a", "a")
        deliver(claim())
        assert store.purge_sent(older_than=timezone.now() + timedelta(seconds=1)) == 1
        assert held(a2) == [False]
        assert claimed() == ids(a2)


def test_the_upgrade_holds_each_keys_later_unsent_messages():
    """Messages stored before keys were ordered are held as they would be now."""
    now = timezone.now()
    rows = [("a", "sent"), ("a", "pending"), ("a", "pending"), ("b", "parked")]
    rows += [("b", "pending"), ("", "pending"), ("", "pending"), ("c", "pending")]
    rows += [("b", "leased")]  # a dispatcher of the old code is delivering it
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            message_id=uuid.uuid4(),
            event_type="test.key_order.step",
            key=key,
            payload_json="{}",
            status="pending" if status == "leased" else status,
            lease_token="t" if status == "leased" else None,
            available_at=now,
            created_at=now,
            updated_at=now,
        )
        for key, status in rows
    )
    hold_later_messages_of_each_key(apps, SimpleNamespace(connection=connection))
    assert list(OutboxMessage.objects.order_by("id").values_list("held", flat=True)) == [
        False,
        False,
        True,
        False,
        True,
        False,
        False,
        False,
        False,
    ]


class OpenProducer:
    """A unit of work in a thread of its own that stores a message with ``key`` and
    stays open (holding the key) until :meth:`commit`."""

    def __init__(self, background: Callable[..., Future[Any]], key: str) -> None:
        self.stored, self._commit = threading.Event(), threading.Event()

        def produce() -> Envelope:
            with unit_of_work() as uow:
                envelope = uow.add_integration_event(Step(0), key=key)
                self.stored.set()
                assert self._commit.wait(30)
            return envelope

        self.future = background(produce)
        assert self.stored.wait(30)

    def commit(self) -> Envelope:
        self._commit.set()
        return self.future.result(30)


@pytest.mark.postgres_only
class TestRacesWithProducers:
    """Two transactions storing messages of one key meet on the key's advisory lock; a
    transaction storing a key's message and a dispatcher ending the key's last unsent
    message meet on that message's row: whichever comes second sees the first."""

    def test_transactions_of_one_key_get_ids_in_commit_order(self, background, blocked_on_lock):
        first = OpenProducer(background, "a")
        second = background(lambda: stage("a")[0])
        blocked_on_lock()  # the second waits for the key, not just for its commit
        a1 = first.commit()
        a2 = second.result(30)
        assert row(a1).id < row(a2).id
        assert held(a1, a2) == [False, True]

    def test_a_delivery_recorded_while_a_producer_holds_the_key_releases_its_message(
        self, background, blocked_on_lock
    ):
        (a1,) = stage("a")
        batch = claim()
        producer = OpenProducer(background, "a")
        recording = background(lambda: deliver(batch))
        blocked_on_lock()  # the key is taken: a1 is recorded once the producer is done
        assert row(a1).status == MessageStatus.PENDING
        a2 = producer.commit()
        assert recording.result(30) == {a1.message_id: RecordOutcome.SENT}
        assert row(a1).status == MessageStatus.SENT
        assert held(a2) == [False]
        assert claimed() == ids(a2)

    def test_a_producer_waiting_for_a_recording_sees_it(self, background, blocked_on_lock):
        (a1,) = stage("a")
        batch = claim()
        recording_open = threading.Event()
        finish_recording = threading.Event()

        def pause(context: dict[str, Any]) -> None:
            recording_open.set()
            assert finish_recording.wait(30)

        def record() -> dict[uuid.UUID, RecordOutcome]:
            with fault_at("outbox.store.recording", pause):
                return deliver(batch)

        recording = background(record)
        assert recording_open.wait(30)
        produced = background(lambda: stage("a")[0])
        blocked_on_lock()
        finish_recording.set()
        assert recording.result(30)[a1.message_id] is RecordOutcome.SENT
        a2 = produced.result(30)
        assert held(a2) == [False]
        assert claimed() == ids(a2)

    def test_a_discard_waits_for_a_producer_of_its_key(self, background, blocked_on_lock):
        (a1,) = stage("a")
        fail(claim(), permanent=True)
        producer = OpenProducer(background, "a")
        discarding = background(lambda: store.discard(a1.message_id))
        blocked_on_lock()
        a2 = producer.commit()
        assert discarding.result(30).released_next
        assert held(a2) == [False]


class TestFollowed:
    """A delivery looks for its key's next message only when one was stored behind it:
    a key without a backlog costs the recording no statement beyond a keyless one."""

    def recorded_statements(self, batch: Batch | None) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            deliver(batch)
        return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]

    def test_keys_with_nothing_behind_them_are_recorded_in_one_statement(self):
        stage("a", "b", "", "c")
        assert len(self.recorded_statements(claim())) == 1
        assert not OutboxMessage.objects.filter(status=MessageStatus.PENDING).exists()

    def test_a_key_with_a_message_behind_it_releases_that_one(self):
        a1, b1 = stage("a", "b")
        (a2,) = stage("a")
        assert [row(e).followed for e in (a1, b1, a2)] == [True, False, False]
        assert len(self.recorded_statements(claim())) == 2  # Sent, then the release
        assert held(a2) == [False]
        assert claimed() == ids(a2)

    def test_a_message_stored_behind_a_held_one_marks_that_one(self):
        a1, a2, a3 = stage("a", "a", "a")
        assert [row(e).followed for e in (a1, a2, a3)] == [True, True, False]
        assert drain() == ids(a1, a2, a3)

    def test_a_row_written_without_the_column_is_followed(self):
        """A row stored by the previous release's code (during an upgrade) is taken as
        followed: its delivery looks for a next message."""
        (a1,) = stage("a")
        older = store_as_older_code("b", held=False)
        assert row(older).followed is True
        assert row(a1).followed is False


def store_as_older_code(key: str, *, held: bool) -> Envelope:
    """A message stored as a producer of the previous release stored it: ``held`` as
    it found, without the ``followed`` column, the message it waits behind unmarked."""
    now = timezone.now()
    envelope = Envelope(
        message_id=uuid.uuid4(), event_type=Step.event_name, payload_json="{}", key=key,
        created_at=now,
    )  # fmt: skip
    table = OutboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (message_id, event_type, key, payload_json, headers, status,"
            " attempts, available_at, created_at, updated_at, last_error, leased_by, held)"
            " VALUES (%s, %s, %s, '{}', '{}', 'pending', 0, %s, %s, %s, '', '', %s)",
            [
                envelope.message_id.hex if connection.vendor == "sqlite" else envelope.message_id,
                envelope.event_type, key, now, now, now, held,
            ],
        )  # fmt: skip
    return envelope


class TestUpgradeRepair:
    """Producers of the previous release, still running beside this one's during an
    upgrade, leave what :func:`store.repair_keys` puts right at a dispatcher's start."""

    def test_a_message_an_older_producer_stored_behind_is_marked_followed(self):
        (a1,) = stage("a")
        a2 = store_as_older_code("a", held=True)
        assert store.repair_keys() == (1, 0)
        assert row(a1).followed is True
        deliver(claim())
        assert claimed() == ids(a2)

    def test_a_key_whose_first_unsent_message_is_held_is_released(self):
        stage("a")
        a2 = store_as_older_code("a", held=True)
        deliver(claim())  # a1 was not followed: a2 is left held, first of its key
        assert claimed() == []
        assert store.repair_keys() == (0, 1)
        assert claimed() == ids(a2)

    def test_keys_in_order_are_left_as_they_are(self):
        a1, _a2, b1, _b2, c1, keyless = stage("a", "a", "b", "b", "c", "")
        fail(claim(limit=1), permanent=True)  # a1 parked: the key halts
        assert row(a1).status == MessageStatus.PARKED
        before = list(OutboxMessage.objects.order_by("id").values_list("held", "followed"))
        assert store.repair_keys() == (0, 0)
        after = list(OutboxMessage.objects.order_by("id").values_list("held", "followed"))
        assert after == before
        assert sorted(claimed(), key=str) == sorted(ids(b1, c1, keyless), key=str)

    def test_a_dispatcher_repairs_at_its_start(self):
        (a1,) = stage("a")
        a2 = store_as_older_code("a", held=True)
        transport = RecordingTransport()
        Dispatcher(burst=True, listen=False, transport=transport).run()
        assert [m.message_id for m in transport.published] == ids(a1, a2)


@pytest.mark.postgres_only
def test_storing_and_releasing_probe_their_indexes():
    """With a long history of each key, a new message finds whether it waits through
    the key index, and a delivery finds the next message through the held index."""
    now = timezone.now()
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            message_id=uuid.uuid4(),
            event_type="test.key_order.step",
            key=f"k{n % 500}",
            payload_json="{}",
            status=MessageStatus.SENT if n % 20 else MessageStatus.PENDING,
            held=n % 40 == 0,
            available_at=now,
            created_at=now,
            updated_at=now,
        )
        for n in range(20_000)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {OutboxMessage._meta.db_table}")
        cursor.execute(
            "EXPLAIN " + store.insert_sql(keyed=True, vendor=connection.vendor),
            ["k1", uuid.uuid4(), "t", "k1", "{}", "{}", "pending", now, now, now],
        )
        stored = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute(
            "EXPLAIN " + store.release_sql(connection.vendor, 2), [False, now, True, "k1", "k2"]
        )
        released = "\n".join(row[0] for row in cursor.fetchall())
        plans = []
        for statement, params in ((store.MARK_FOLLOWED, []), (store.RELEASE_STRANDED, [now])):
            cursor.execute("EXPLAIN " + statement, params)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    assert "outbox_msg_key_idx" in stored, stored
    for plan in plans:  # the repair reads unsent and held messages, not the history
        assert "Seq Scan" not in plan, plan
    assert "outbox_msg_held_idx" in released, released
    assert "Seq Scan" not in released, released  # each released row by its id
