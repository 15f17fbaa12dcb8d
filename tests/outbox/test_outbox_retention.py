"""Retention of the outbox's growing tables, on by default: sent messages (7 days),
parked ones (30 days) and inbox records (14 days), each with its own setting (None
keeps for ever); deleted by every dispatcher in bounded batches and by
``manage.py purge_outbox``; pending messages, and parked ones that halt their key,
are never touched."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone

from outbox import IntegrationEvent, store, unit_of_work
from outbox.conf import outbox_settings
from outbox.exceptions import InvalidInput
from outbox.inbox import consume
from outbox.models import InboxMessage, OutboxMessage
from outbox.testing import RecordingTransport, deliver_outbox
from outbox.types import MessageStatus
from tests.support.procs import database_url

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)


@dataclass(frozen=True)
class Kept(IntegrationEvent, name="test.retention.kept"):
    n: int


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True, "MAX_ATTEMPTS": 1}


def stage(count: int, key: str = "") -> list[uuid.UUID]:
    with unit_of_work() as uow:
        return [uow.add_integration_event(Kept(n), key=key).message_id for n in range(count)]


def age(message_id: uuid.UUID, days: float) -> None:
    """Move a message's sent and park times into the past, as time passing would."""
    then = timezone.now() - days * DAY
    OutboxMessage.objects.filter(message_id=message_id).update(sent_at=then, updated_at=then)


def inbox(consumer: str, days: float) -> None:
    with transaction.atomic(), consume(consumer, uuid.uuid4()) as new:
        assert new
    InboxMessage.objects.filter(consumer=consumer).update(processed_at=timezone.now() - days * DAY)


def world() -> dict[str, uuid.UUID]:
    """Sent 8 and 6 days ago, parked 31 and 29 days ago, one keyed parked 31 days ago
    (it halts its key: kept), one pending; inbox records processed 15 and 13 days
    ago."""
    sent_old, sent_new = stage(2)
    deliver_outbox(transport=RecordingTransport())
    parked_old, parked_new = stage(2)
    (halting,) = stage(1, key="order-1")
    deliver_outbox(transport=RecordingTransport(fail_with="down"))
    (pending,) = stage(1)
    for message_id, days in (
        (sent_old, 8),
        (sent_new, 6),
        (parked_old, 31),
        (parked_new, 29),
        (halting, 31),
    ):
        age(message_id, days)
    inbox("old-consumer", 15)
    inbox("new-consumer", 13)
    return {
        "sent_old": sent_old,
        "sent_new": sent_new,
        "parked_old": parked_old,
        "parked_new": parked_new,
        "halting": halting,
        "pending": pending,
    }


def left() -> set[uuid.UUID]:
    return set(OutboxMessage.objects.values_list("message_id", flat=True))


def test_the_defaults_are_documented_values() -> None:
    s = outbox_settings()
    assert (s.RETENTION_SECONDS, s.PARKED_RETENTION_SECONDS, s.INBOX_RETENTION_SECONDS) == (
        7 * 86_400,
        30 * 86_400,
        14 * 86_400,
    )


def test_a_dispatcher_deletes_each_table_past_its_default_retention() -> None:
    ids = world()
    stats = deliver_outbox(transport=RecordingTransport())
    assert stats.purged == 3  # one sent, one parked, one inbox record
    assert left() == {ids["sent_new"], ids["parked_new"], ids["halting"], ids["pending"]}
    assert OutboxMessage.objects.get(message_id=ids["pending"]).status == MessageStatus.SENT
    assert set(InboxMessage.objects.values_list("consumer", flat=True)) == {"new-consumer"}


def test_none_keeps_each_table_for_ever(settings) -> None:
    settings.OUTBOX = {
        **settings.OUTBOX,
        "RETENTION_SECONDS": None,
        "PARKED_RETENTION_SECONDS": None,
        "INBOX_RETENTION_SECONDS": None,
    }
    ids = world()
    assert deliver_outbox(transport=RecordingTransport()).purged == 0
    assert left() == set(ids.values())
    assert InboxMessage.objects.count() == 2


def test_purge_parked_deletes_in_batches_and_never_a_redelivered_message() -> None:
    parked = stage(3)
    deliver_outbox(transport=RecordingTransport(fail_with="down"))
    for message_id in parked:
        age(message_id, 40)
    store.redeliver(parked[0])  # pending again: no longer parked
    cutoff = timezone.now() - 30 * DAY
    assert store.purge_parked(older_than=cutoff, limit=1) == 1
    assert store.purge_parked(older_than=cutoff, limit=5) == 1
    assert store.purge_parked(older_than=cutoff) == 0
    assert left() == {parked[0]}


@pytest.mark.parametrize(
    ("older_than", "limit"),
    [(timezone.now(), 0), (timezone.now(), True), (timezone.now(), 10**6), ("yesterday", 10)],
)
def test_bad_purge_arguments_are_typed(older_than, limit) -> None:
    stage(1)
    with pytest.raises(InvalidInput):
        store.purge_parked(older_than=older_than, limit=limit)
    assert OutboxMessage.objects.count() == 1


class TestPurgeOutboxCommand:
    def test_without_an_argument_each_table_uses_its_retention(self, capsys) -> None:
        ids = world()
        call_command("purge_outbox")
        out = capsys.readouterr().out
        assert "deleted 1 sent message(s)" in out
        assert "deleted 1 parked message(s)" in out
        assert "deleted 1 inbox record(s)" in out
        assert left() == {ids["sent_new"], ids["parked_new"], ids["halting"], ids["pending"]}

    def test_older_than_days_overrides_every_retention(self, capsys) -> None:
        ids = world()
        call_command("purge_outbox", "--older-than-days", "1")
        assert left() == {ids["halting"], ids["pending"]}
        assert InboxMessage.objects.count() == 0

    def test_dry_run_counts_and_deletes_nothing(self, capsys) -> None:
        ids = world()
        call_command("purge_outbox", "--dry-run")
        assert "1 parked message(s) before" in capsys.readouterr().out
        assert left() == set(ids.values())

    def test_a_table_kept_for_ever_is_said_so(self, settings, capsys) -> None:
        settings.OUTBOX = {**settings.OUTBOX, "PARKED_RETENTION_SECONDS": None}
        world()
        call_command("purge_outbox")
        assert "parked message(s): kept for ever" in capsys.readouterr().out
        assert OutboxMessage.objects.parked().count() == 3

    def test_every_retention_none_and_no_argument_is_an_error(self, settings) -> None:
        settings.OUTBOX = {
            **settings.OUTBOX,
            "RETENTION_SECONDS": None,
            "PARKED_RETENTION_SECONDS": None,
            "INBOX_RETENTION_SECONDS": None,
        }
        with pytest.raises(CommandError, match="PARKED_RETENTION_SECONDS"):
            call_command("purge_outbox")


@pytest.mark.postgres_only
def test_a_row_another_transaction_holds_is_skipped_not_waited_for() -> None:
    """Retention never waits on the engines' statements: a parked message an operator
    is redelivering at that moment (its row locked) is left to the next clean-up."""
    import psycopg  # PostgreSQL only: the driver need not be installed for SQLite

    parked = stage(2)
    deliver_outbox(transport=RecordingTransport(fail_with="down"))
    for message_id in parked:
        age(message_id, 40)
    held = OutboxMessage.objects.get(message_id=parked[0]).pk
    with psycopg.connect(database_url()) as other:
        table = OutboxMessage._meta.db_table
        other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [held])
        assert store.purge_parked(older_than=timezone.now() - 30 * DAY) == 1
    assert left() == {parked[0]}
