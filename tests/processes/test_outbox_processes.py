"""Delivery and crash safety with real ``dispatch_outbox`` processes: SIGKILL mid-batch
loses nothing (redeliveries are caught by the inbox), several dispatchers never deliver
a message twice, and the command's options and signals — on SQLite and PostgreSQL.
Crashes happen at named fault points (``ORDERS_FAULT``, see testproject/faults.py), so
every run crashes at the same place."""

from __future__ import annotations

import signal
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from outbox.models import InboxMessage, OutboxMessage
from outbox.types import MessageStatus
from testproject.orders.events import InvoiceIssued, OrderPlaced
from testproject.orders.models import Delivery, Invoice
from testproject.orders.services import place_order
from tests.support.procs import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}


def place_orders(count: int) -> None:
    for n in range(count):
        place_order(f"O-{n:03}", Decimal("10.00") + n)


def placed() -> Any:
    return OutboxMessage.objects.filter(event_type=OrderPlaced.event_name)


def all_delivered() -> bool:
    return not OutboxMessage.objects.exclude(status=MessageStatus.SENT).exists()


def assert_each_order_billed_once(count: int) -> None:
    assert Invoice.objects.count() == count
    assert InboxMessage.objects.filter(consumer="billing").count() == count
    fresh = Delivery.objects.filter(fresh=True)
    assert sorted(fresh.values_list("message_id", flat=True)) == sorted(
        str(m) for m in placed().values_list("message_id", flat=True)
    )
    assert OutboxMessage.objects.filter(event_type=InvoiceIssued.event_name).count() == count


def test_sigkill_mid_batch_loses_nothing_and_the_restart_delivers(dispatchers, tmp_path):
    """A dispatcher blocks after the 15th delivery (the middle of its second batch of
    10) and is killed with SIGKILL; restarted with the same id, it recovers the
    unrecorded batch at once and delivers it again. Billing sees each redelivered
    message a second time and the inbox makes it skip."""
    place_orders(30)
    marker = tmp_path / "blocked"
    victim = dispatchers(
        "--dispatcher-id",
        "d1",
        "--batch-size",
        "10",
        env={"ORDERS_FAULT": f"outbox.in_process.delivered@15:block:{marker}"},
    )
    wait_until(marker.exists, 60, "the dispatcher to reach the fault point", victim)  # type: ignore[arg-type]
    victim.proc.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL

    in_flight = set(placed().filter(leased_by="d1").values_list("message_id", flat=True))
    assert len(in_flight) == 10, victim.output
    assert placed().filter(status=MessageStatus.SENT).count() == 10
    delivered_before_kill = set(Delivery.objects.values_list("message_id", flat=True))
    assert len(delivered_before_kill) == 15
    redelivered = {str(m) for m in in_flight} & delivered_before_kill
    assert len(redelivered) == 5

    restarted = dispatchers("--dispatcher-id", "d1", "--batch-size", "10", "--burst")
    assert restarted.wait() == 0, restarted.output
    assert "recovered" in restarted.output
    assert all_delivered()
    assert_each_order_billed_once(30)
    duplicates = Delivery.objects.filter(fresh=False)
    assert set(duplicates.values_list("message_id", flat=True)) == redelivered
    assert duplicates.count() == 5


def test_a_dispatcher_killing_itself_before_recording_is_recovered_by_another(dispatchers):
    """The process SIGKILLs itself right after the transport confirmed its first batch
    and before anything was recorded; another dispatcher takes the batch over once
    the lease has expired."""
    place_orders(12)
    victim = dispatchers(
        "--dispatcher-id",
        "victim",
        "--batch-size",
        "5",
        env={"ORDERS_FAULT": "outbox.dispatcher.published@1:kill", "OUTBOX_LEASE_SECONDS": "1"},
    )
    assert victim.wait() == -signal.SIGKILL, victim.output
    assert placed().filter(leased_by="victim").count() == 5
    assert Delivery.objects.count() == 5
    assert not placed().filter(status=MessageStatus.SENT).exists()

    survivor = dispatchers(
        "--dispatcher-id",
        "survivor",
        env={"OUTBOX_RECOVERY_INTERVAL": "0.2", "OUTBOX_POLL_INTERVAL": "0.1"},
    )
    wait_until(all_delivered, 60, "every message to be sent", survivor)  # type: ignore[arg-type]
    survivor.proc.send_signal(signal.SIGTERM)
    assert survivor.wait() == 0, survivor.output
    assert "recovered" in survivor.output
    assert "stopped:" in survivor.output
    assert_each_order_billed_once(12)
    assert Delivery.objects.filter(fresh=False).count() == 5
    assert set(placed().filter(attempts=2).values_list("leased_by", flat=True)) == {""}


def test_several_dispatchers_never_deliver_one_message_twice(dispatchers, tmp_path):
    """Four dispatchers meet at a barrier right after each claimed its first batch,
    so all of them claim and deliver at the same time. Every message is claimed
    exactly once (one attempt) and reaches billing once."""
    place_orders(120)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {"ORDERS_FAULT": f"outbox.dispatcher.claimed@1:barrier:{barrier}:4"}
    procs = [
        dispatchers("--dispatcher-id", f"d{n}", "--batch-size", "5", "--burst", env=env)
        for n in range(4)
    ]
    for proc in procs:
        assert proc.wait() == 0, proc.output
    assert len(list(barrier.iterdir())) == 4
    assert all_delivered()
    assert set(OutboxMessage.objects.values_list("attempts", flat=True)) == {1}
    assert_each_order_billed_once(120)
    assert not Delivery.objects.filter(fresh=False).exists()
    assert Delivery.objects.values("pid").distinct().count() == 4


def test_the_command_reports_and_rejects_bad_arguments():
    place_orders(2)
    out = StringIO()
    call_command("dispatch_outbox", "--burst", "--dispatcher-id", "cmd", stdout=out)
    text = out.getvalue()
    assert "dispatcher cmd: transport in-process, batches of 100" in text
    assert "dispatcher cmd stopped: claimed 4 in" in text
    assert all_delivered()
    with pytest.raises(CommandError, match="--batch-size"):
        call_command("dispatch_outbox", "--batch-size", "0")
    with pytest.raises(CommandError, match="--dispatcher-id must not be empty"):
        call_command("dispatch_outbox", "--dispatcher-id", "")
