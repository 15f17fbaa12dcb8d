"""Ordered delivery per key with real ``dispatch_outbox`` processes, on SQLite and
PostgreSQL: two dispatchers keep each key's order while the broker fails now and then
and goes down and comes back, with messages stored as they run; a parked message halts
its key while every other key and keyless message flows, and its redelivery resumes
the key; a dispatcher killed with a key's message in flight hands it on without
letting the next one overtake it.

The dispatchers publish through ``tests.support.outbox.LoggingTransport``: one log
file of every publish's start and end, read afterwards (see ``order_violations``)."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from outbox import IntegrationEvent, store, unit_of_work
from outbox.models import OutboxMessage
from outbox.types import Envelope, MessageStatus
from tests.support.outbox import (
    DispatcherProcess,
    order_violations,
    read_log,
    sent_ids,
    transport_env,
)
from tests.support.procs import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Fast retries that never run out: a message fails a few times in a row at most.
RETRIES = {
    "OUTBOX_RETRY_BASE_DELAY": "0.01",
    "OUTBOX_MAX_ATTEMPTS": "1000",
    "OUTBOX_POLL_INTERVAL": "0.05",
}


@dataclass(frozen=True)
class Moved(IntegrationEvent, name="test.order.moved"):
    n: int


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}


class Stored:
    """What the test stored, per key, in stored order."""

    def __init__(self) -> None:
        self.by_key: dict[str, list[str]] = {}

    def add(self, *keys: str) -> list[Envelope]:
        """One transaction storing a message per key given (``""``: keyless)."""
        with unit_of_work() as uow:
            envelopes = [uow.add_integration_event(Moved(n), key=key) for n, key in enumerate(keys)]
        for envelope in envelopes:
            self.by_key.setdefault(envelope.key, []).append(str(envelope.message_id))
        return envelopes

    def rounds(self, keys: Sequence[str], per_key: int, transactions: int) -> None:
        """``per_key`` messages of each key and as many keyless ones, interleaved, over
        ``transactions`` transactions."""
        sequence = [key for _ in range(per_key) for key in [*keys, ""]]
        size = -(-len(sequence) // transactions)
        for start in range(0, len(sequence), size):
            self.add(*sequence[start : start + size])

    @property
    def all(self) -> set[str]:
        return {m for ids in self.by_key.values() for m in ids}


def all_sent() -> bool:
    return not OutboxMessage.objects.unsent().exists()


def stop(*procs: DispatcherProcess) -> None:
    """SIGTERM each dispatcher once it has started (on a busy machine one may still be
    starting when the others have sent everything: its handler is not there yet)."""
    for proc in procs:
        proc.wait_for_output("started transport", 120)
        proc.signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait() == 0, proc.output


def count(log: Path, event: str) -> Callable[[], int]:
    return lambda: sum(1 for line in read_log(log) if line.event == event)


def test_two_dispatchers_keep_each_keys_order_while_the_broker_fails_and_recovers(
    dispatchers, tmp_path
):
    """5 % of publishes fail throughout; in the middle the broker is down for a while
    (every batch raises), then back. Messages are stored before, during and after the
    outage, while both dispatchers run."""
    log, down, barrier = tmp_path / "published.log", tmp_path / "down", tmp_path / "barrier"
    barrier.mkdir()
    env = {
        **RETRIES,
        **transport_env(log, fail_ratio=0.05, down=str(down)),
        "OUTBOX_BATCH_SIZE": "7",
        # Both dispatchers hold a batch at the same moment once.
        "ORDERS_FAULT": f"outbox.dispatcher.claimed@1:barrier:{barrier}:2",
    }
    keys = [f"order-{n}" for n in range(6)]
    stored = Stored()
    stored.rounds(keys, per_key=8, transactions=6)
    procs = [dispatchers("--dispatcher-id", f"d{n}", env=env) for n in range(2)]
    wait_until(lambda: count(log, "sent")() >= 40, 60, "a first part to go out", procs[0])

    down.touch()
    stored.rounds(keys, per_key=8, transactions=6)
    wait_until(lambda: count(log, "down")() >= 4, 60, "failed batches while down", procs[0])
    down.unlink()

    stored.rounds(keys, per_key=8, transactions=6)
    wait_until(all_sent, 180, "every message to be sent", procs[0])
    stop(*procs)

    lines = read_log(log)
    assert order_violations(lines, stored.by_key) == []
    sent = Counter(sent_ids(lines))
    assert set(sent) == stored.all
    assert set(sent.values()) == {1}  # no crash here: nothing went out twice
    assert count(log, "failed")() > 0
    assert len({line.pid for line in lines if line.event == "sent"}) == 2
    assert len(list(barrier.iterdir())) == 2


def test_a_parked_message_halts_its_key_while_the_rest_flows_until_redelivered(
    dispatchers, tmp_path
):
    """The broker rejects one message for good: it is parked, its key's later messages
    wait (never published), other keys and keyless messages, also those stored
    meanwhile, go out; once the broker accepts it, its redelivery resumes the key."""
    log, reject = tmp_path / "published.log", tmp_path / "reject"
    env = {**RETRIES, **transport_env(log, reject=str(reject))}
    stored = Stored()
    a1, b1, x1, a2, b2, x2, a3, a4 = stored.add("a", "b", "", "a", "b", "", "a", "a")
    reject.write_text(f"{a2.message_id}\n")
    procs = [dispatchers("--dispatcher-id", f"d{n}", env=env) for n in range(2)]

    def halted() -> bool:
        return OutboxMessage.objects.halting().filter(message_id=a2.message_id).exists()

    def flowed(*envelopes: Envelope) -> Callable[[], bool]:
        wanted = {str(e.message_id) for e in envelopes}
        return lambda: wanted <= set(sent_ids(read_log(log)))

    wait_until(halted, 60, "the rejected message to be parked", procs[0])
    wait_until(flowed(a1, b1, x1, b2, x2), 60, "the rest to go out", procs[0])
    b3, x3 = stored.add("b", "")
    wait_until(flowed(b3, x3), 60, "messages stored meanwhile to go out", procs[0])
    waiting = {str(a3.message_id), str(a4.message_id)}
    assert not waiting & {line.message_id for line in read_log(log)}  # never started
    assert set(OutboxMessage.objects.filter(held=True).values_list("message_id", flat=True)) == {
        a3.message_id,
        a4.message_id,
    }

    reject.write_text("")
    store.redeliver(a2.message_id)
    wait_until(all_sent, 60, "the key to go on", procs[0])
    stop(*procs)

    lines = read_log(log)
    assert order_violations(lines, stored.by_key) == []
    assert [m for m in sent_ids(lines) if m in stored.by_key["a"]] == stored.by_key["a"]
    assert [line.event for line in lines if line.message_id == str(a2.message_id)] == [
        "start",
        "rejected",
        "start",
        "sent",
    ]


def test_a_killed_dispatchers_message_goes_out_again_before_its_keys_next(dispatchers, tmp_path):
    """A dispatcher publishes its first batch and is SIGKILLed before recording it; the
    other one recovers the batch once its lease expired and publishes it again (at
    least once), and only then each key's next message."""
    log = tmp_path / "published.log"
    env = {**RETRIES, **transport_env(log), "OUTBOX_LEASE_SECONDS": "1"}
    stored = Stored()
    stored.add("a", "b", "a", "b", "a", "b")
    victim = dispatchers(
        "--dispatcher-id",
        "victim",
        env={**env, "ORDERS_FAULT": "outbox.dispatcher.published@1:kill"},
    )
    assert victim.wait() == -signal.SIGKILL, victim.output
    first = {line.message_id for line in read_log(log) if line.event == "sent"}
    assert first == {stored.by_key["a"][0], stored.by_key["b"][0]}
    assert OutboxMessage.objects.filter(status=MessageStatus.SENT).count() == 0

    survivor = dispatchers(
        "--dispatcher-id", "survivor", env={**env, "OUTBOX_RECOVERY_INTERVAL": "0.2"}
    )
    wait_until(all_sent, 60, "every message to be sent", survivor)
    stop(survivor)
    lines = read_log(log)
    assert order_violations(lines, stored.by_key) == []
    sent = [m for m in sent_ids(lines) if m in stored.by_key["a"]]
    a1, a2, a3 = stored.by_key["a"]
    assert sent == [a1, a1, a2, a3]
