"""Ordered outbox delivery: what keys cost the dispatcher, and whether several
dispatchers keep each key's order while the broker fails now and then.

- **Key cost**: one ``Dispatcher`` drains ``outbox_messages`` messages stored by one
  unit of work, through a transport that only keeps what it is given
  (``outbox.testing.RecordingTransport``): without keys; each with a key of its own;
  and without keys while one key is halted, ``outbox_messages`` messages held behind
  its parked first one. The three are rotated within each run, and each figure is the
  median of the runs; the ratios are against the keyless drain of the same runs. The
  time the unit of work took to store each set is kept beside it, and per message the
  statements and the server's time executing them (``pg_stat_statements``), the WAL,
  and the dispatcher's own CPU time (this process), so that a ratio on a loaded
  machine can be told apart into work and waiting.
- **Order under failures**: ``order_keys`` keys x ``order_per_key`` messages, stored
  interleaved (message n has key n mod ``order_keys``) in transactions of 1,000, then
  drained by ``order_dispatchers`` dispatchers (threads of this process, each with its
  own connection) through a transport that fails 5 % of publishes at random; retries
  start after 50 ms. The same number of messages without keys is drained the same way,
  and the keyed drain's rate is given against it (the two alternate from run to run;
  medians). Every publish the transport accepted is recorded in the order it happened,
  and fault hooks note which keys are in flight between a claim and its record. A
  violation is a message that reached the transport after a later message of its key,
  a batch claimed while another batch held a message of one of its keys, or two
  messages of one key in one batch; and at the end every key's messages, each the
  first time the transport accepted it, must be all of the key's messages in stored
  order.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from outbox import IntegrationEvent, unit_of_work

#: The share of publishes the transport fails in the order run.
FAIL_RATIO = 0.05
#: Messages stored per transaction in the order run.
PER_TRANSACTION = 1_000
#: Variants of the key cost, by name.
KEY_VARIANTS = ("keyless", "distinct keys", "keyless, one key halted")


@dataclass(frozen=True)
class Moved(IntegrationEvent, name="bench.moved"):
    n: int


def _store(keys: list[str]) -> float:
    """Seconds one unit of work took to store a message per key of ``keys``."""
    start = time.perf_counter()
    with unit_of_work() as uow:
        for n, key in enumerate(keys):
            uow.add_integration_event(Moved(n), key=key)
    return time.perf_counter() - start


def _halt_a_key(backlog: int) -> None:
    """One key whose first message is parked, ``backlog`` messages held behind it."""
    from outbox import store

    with unit_of_work() as uow:
        first = uow.add_integration_event(Moved(0), key="halted")
    store.park(first.message_id, "halted for the benchmark")
    _store(["halted"] * backlog)


def key_cost(runner: Any, chosen: Any) -> dict[str, Any]:
    """The key cost (module docstring): drain rates and store times per variant."""
    from outbox.dispatcher import Dispatcher
    from outbox.models import OutboxMessage
    from outbox.testing import RecordingTransport

    from . import physical
    from .harness import median, rotated

    messages, table = runner.plan.outbox_messages, OutboxMessage._meta.db_table
    drain: dict[str, list[float]] = {name: [] for name in KEY_VARIANTS}
    store_s: dict[str, list[float]] = {name: [] for name in KEY_VARIANTS}
    server: dict[str, list[dict[str, Any]]] = {name: [] for name in KEY_VARIANTS}
    for run in range(runner.plan.runs):
        for name in rotated(list(KEY_VARIANTS), run):
            runner.admin(f"TRUNCATE {table}")
            if name == "keyless, one key halted":
                _halt_a_key(messages)
            distinct = name == "distinct keys"
            keys = [f"k{n}" for n in range(messages)] if distinct else [""] * messages
            store_s[name].append(_store(keys))
            runner.admin(f"ANALYZE {table}")
            runner.admin("CHECKPOINT")
            transport = RecordingTransport()
            dispatcher = Dispatcher(burst=True, listen=False, transport=transport)
            cost: dict[str, Any] = {}
            with physical.counting(runner.database_url, runner.statements, cost):
                start, cpu = time.perf_counter(), time.process_time()
                stats = dispatcher.run()
                drain[name].append(messages / (time.perf_counter() - start))
                cpu = time.process_time() - cpu
            server[name].append(
                {**physical.per_job(cost, messages), "client_cpu_us": cpu * 1e6 / messages}
            )
            assert stats.sent == messages == len(transport.published), stats.summary()
            runner.log(f"  outbox {name:24} {drain[name][-1]:10.1f} messages/s")
    rates = {name: median(values) for name, values in drain.items()}
    per_message = {
        name: {
            figure: median([run[figure] for run in runs])
            for figure in runs[0]
            if isinstance(runs[0][figure], int | float)
        }
        for name, runs in server.items()
    }
    return {
        "messages": messages,
        "runs": drain,
        "median": rates,
        "store_seconds": {name: median(values) for name, values in store_s.items()},
        # Time per message against the keyless drain: above 1, keys cost that much more.
        "cost": {name: rates["keyless"] / rate for name, rate in rates.items()},
        # What the server did per message (statements, their execution time, WAL).
        "per_message": per_message,
    }


class _OrderWatch:
    """What the dispatchers do to each key: the keys in flight (fault hooks at the
    claim and in the record's transaction, before its commit releases the next
    message), and the violations seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight: dict[str, str] = {}
        self.batch_keys: dict[str, list[str]] = {}
        self.overlaps = 0
        self.same_key_batches = 0
        self.failed = 0

    def hook(self, name: str, context: dict[str, Any]) -> None:
        with self.lock:
            if name == "outbox.dispatcher.claimed":
                batch = context["batch"]
                keys = [m.key for m in batch.messages if m.key]
                self.same_key_batches += len(keys) != len(set(keys))
                self.overlaps += sum(1 for key in keys if key in self.in_flight)
                self.in_flight.update(dict.fromkeys(keys, batch.token))
                self.batch_keys[batch.token] = keys
            elif name == "outbox.store.recording":
                for key in self.batch_keys.pop(context["token"], []):
                    self.in_flight.pop(key, None)

    def fail(self, envelope: Any) -> str | None:
        if random.random() < FAIL_RATIO:
            with self.lock:
                self.failed += 1
            return "the broker failed (benchmark)"
        return None


@contextmanager
def _watched(watch: _OrderWatch) -> Iterator[None]:
    from outbox.faults import add_fault_hook, remove_fault_hook

    add_fault_hook(watch.hook)
    try:
        yield
    finally:
        remove_fault_hook(watch.hook)


def out_of_order(published: list[Any], position: dict[Any, int]) -> tuple[int, int]:
    """Messages that reached the transport after a later one of their key (keyless
    ones go out in any order), and messages that reached it more than once."""
    last: dict[str, int] = defaultdict(lambda: -1)
    late = 0
    for envelope in published:
        if not envelope.key:
            continue
        at = position[envelope.message_id]
        late += at < last[envelope.key]
        last[envelope.key] = max(at, last[envelope.key])
    twice = len(published) - len({e.message_id for e in published})
    return late, twice


def keys_in_order(published: list[Any], stored: dict[Any, tuple[int, str]]) -> int:
    """How many keys reached the transport whole and in stored order: each key's
    messages, each at the first time the transport accepted it, are every message
    stored with the key, in stored order. (``stored``: each message's place and key.)"""
    reached: dict[str, list[int]] = defaultdict(list)
    seen: set[Any] = set()
    for envelope in published:
        if envelope.key and envelope.message_id not in seen:
            seen.add(envelope.message_id)
            reached[envelope.key].append(stored[envelope.message_id][0])
    expected: dict[str, list[int]] = defaultdict(list)
    for at, key in sorted(stored.values()):
        if key:
            expected[key].append(at)
    return sum(1 for key, places in expected.items() if reached.get(key) == places)


def _drain_with_failures(runner: Any, keys: list[str]) -> dict[str, Any]:
    """Store a message per key of ``keys`` (``""``: keyless) in transactions of
    :data:`PER_TRANSACTION`, drain them with the plan's dispatchers through a failing
    transport, and say what happened (see :func:`order_under_failures`)."""
    from django.conf import settings
    from django.db import connections
    from django.test.utils import override_settings

    from outbox.dispatcher import Dispatcher
    from outbox.models import OutboxMessage
    from outbox.testing import RecordingTransport

    from . import physical

    table = OutboxMessage._meta.db_table
    runner.admin(f"TRUNCATE {table}")
    start = time.perf_counter()
    for at in range(0, len(keys), PER_TRANSACTION):
        _store(keys[at : at + PER_TRANSACTION])
    stored_s = time.perf_counter() - start
    rows = OutboxMessage.objects.order_by("id").values_list("message_id", "key")
    stored = {message_id: (n, key) for n, (message_id, key) in enumerate(rows)}
    position = {message_id: n for message_id, (n, _) in stored.items()}
    runner.admin(f"ANALYZE {table}")
    runner.admin("CHECKPOINT")
    watch = _OrderWatch()
    transport = RecordingTransport(fail_with=watch.fail)
    outbox = {**settings.OUTBOX, "RETRY_BASE_DELAY": 0.05, "MAX_ATTEMPTS": 100}
    outbox["POLL_INTERVAL"] = 0.05
    cost: dict[str, Any] = {}
    with override_settings(OUTBOX=outbox), _watched(watch):
        dispatchers = [
            Dispatcher(dispatcher_id=f"bench-{n}", listen=True, transport=transport)
            for n in range(runner.plan.order_dispatchers)
        ]
        threads = [threading.Thread(target=_run_closing(d.run)) for d in dispatchers]
        with physical.counting(runner.database_url, runner.statements, cost):
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            deadline = start + 3600
            while _unsent(table):
                if time.perf_counter() > deadline:
                    raise TimeoutError("the order run did not drain within an hour")
                time.sleep(0.2)
            seconds = time.perf_counter() - start
        for dispatcher in dispatchers:
            dispatcher.stop()
        for thread in threads:
            thread.join(60)
    connections.close_all()
    late, twice = out_of_order(transport.published, position)
    in_order = keys_in_order(transport.published, stored)
    key_count = len({key for _, key in stored.values() if key})
    violations = late + watch.overlaps + watch.same_key_batches + key_count - in_order
    return {
        "store_seconds": stored_s,
        "seconds": seconds,
        "rate": len(stored) / seconds,
        "failed_publishes": watch.failed,
        "sent": len(transport.published),
        "published_twice": twice,
        "late": late,
        "overlaps": watch.overlaps,
        "same_key_batches": watch.same_key_batches,
        "keys_in_order": in_order,
        "violations": violations,
        "per_message": physical.per_job(cost, len(stored)),
    }


#: The two drains of the order run, by name.
ORDER_VARIANTS = ("keyless", "keyed")


def order_under_failures(runner: Any, chosen: Any) -> dict[str, Any]:
    """The order run (module docstring): messages/s of the keyed drain and of the
    keyless one, the keyed drain's cost against it, and the violations counted."""
    from .harness import median, rotated

    plan = runner.plan
    keys, per_key, count = plan.order_keys, plan.order_per_key, plan.order_dispatchers
    sequences = {
        "keyless": [""] * (keys * per_key),
        "keyed": [f"key-{n % keys}" for n in range(keys * per_key)],
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ORDER_VARIANTS}
    for run in range(plan.runs):
        for name in rotated(list(ORDER_VARIANTS), run):
            drained = _drain_with_failures(runner, sequences[name])
            runs[name].append(drained)
            runner.log(
                f"  outbox order, {name}: {keys * per_key:,} in {drained['seconds']:.1f} s,"
                f" {drained['violations']} violations"
            )
    rates = {name: median([r["rate"] for r in results]) for name, results in runs.items()}
    keyed = runs["keyed"]
    return {
        "keys": keys,
        "per_key": per_key,
        "dispatchers": count,
        "fail_ratio": FAIL_RATIO,
        "runs": {name: [r["rate"] for r in results] for name, results in runs.items()},
        "median": rates,
        # Time per message against the keyless drain: above 1, keys cost that much more.
        "cost": rates["keyless"] / rates["keyed"],
        "store_seconds": {
            name: median([r["store_seconds"] for r in results]) for name, results in runs.items()
        },
        "per_message": {
            name: {
                figure: median([r["per_message"][figure] for r in results])
                for figure in results[0]["per_message"]
                if isinstance(results[0]["per_message"][figure], int | float)
            }
            for name, results in runs.items()
        },
        "rate": rates["keyed"],
        "seconds": median([r["seconds"] for r in keyed]),
        "failed_publishes": sum(r["failed_publishes"] for r in keyed),
        "sent": min(r["sent"] for r in keyed),
        "published_twice": sum(r["published_twice"] for r in keyed),
        "late": sum(r["late"] for r in keyed),
        "overlaps": sum(r["overlaps"] for r in keyed),
        "same_key_batches": sum(r["same_key_batches"] for r in keyed),
        "keys_in_order": min(r["keys_in_order"] for r in keyed),
        "violations": sum(r["violations"] for r in keyed),
    }


def _unsent(table: str) -> bool:
    """Whether a message is unsent (a poll of the harness's: not counted; a probe of
    the status index, not a scan of the table)."""
    from django.db import connection

    from .physical import HARNESS_MARK

    with connection.cursor() as cursor:
        cursor.execute(
            f"{HARNESS_MARK} SELECT EXISTS (SELECT 1 FROM {table}"
            " WHERE status IN ('pending', 'parked'))"
        )
        return bool(cursor.fetchone()[0])


def _run_closing(run: Callable[[], Any]) -> Callable[[], None]:
    from django.db import connections

    def target() -> None:
        try:
            run()
        finally:
            connections.close_all()

    return target


def measure(runner: Any, chosen: Any) -> dict[str, Any]:
    """Both parts, as ``--only outbox`` and the full run record them."""
    return {"key_cost": key_cost(runner, chosen), "order": order_under_failures(runner, chosen)}
