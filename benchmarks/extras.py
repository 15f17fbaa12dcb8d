"""Outbox dispatch throughput and saga step overhead (django-ledon's own apps; no
peer here has an equivalent, so these are absolute figures, not ratios)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from outbox import IntegrationEvent, unit_of_work
from sagas import SagaContext, run_saga, saga

SAGA = "bench.three_steps"


@dataclass(frozen=True)
class Ping(IntegrationEvent, name="bench.ping"):
    n: int


def _noop(ctx: SagaContext) -> None:
    return None


saga(SAGA).step("one", _noop).step("two", _noop).step("three", _noop)


def outbox_dispatch(messages: int, runs: int, admin: Any) -> dict[str, Any]:
    """Messages/s of one in-process ``Dispatcher`` (in-process transport) draining
    ``messages`` integration events stored by one unit of work."""
    from outbox.dispatcher import Dispatcher
    from outbox.models import OutboxMessage

    rates = []
    for _ in range(runs):
        admin(f"TRUNCATE {OutboxMessage._meta.db_table} CASCADE")
        with unit_of_work() as uow:
            for n in range(messages):
                uow.add_integration_event(Ping(n))
        admin(f"ANALYZE {OutboxMessage._meta.db_table}")
        admin("CHECKPOINT")
        dispatcher = Dispatcher(burst=True, listen=False)
        start = time.perf_counter()
        stats = dispatcher.run()
        rates.append(messages / (time.perf_counter() - start))
        assert stats.sent == messages, stats.summary()
    return {"messages": messages, "runs": rates, "median": statistics.median(rates)}


def saga_steps(instances: int, runs: int, admin: Any) -> dict[str, Any]:
    """``run_saga`` of a saga of three no-op steps: ms per step (each step commits its
    own transaction with its completion mark), against an empty ``atomic`` commit."""
    from django.db import connection, transaction

    from sagas.models import SagaInstance

    per_step = []
    for _ in range(runs):
        admin(f"TRUNCATE {SagaInstance._meta.db_table} CASCADE")
        admin("CHECKPOINT")
        start = time.perf_counter()
        for n in range(instances):
            run_saga(SAGA, {"n": n})
        per_step.append((time.perf_counter() - start) * 1000 / (instances * 3))
    # Baseline: a durable transaction that writes one row (the commit's own cost) —
    # into an ordinary table: a temporary one writes no WAL and commits for free.
    baseline = []
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_commit (n int)")
        try:
            for n in range(instances * 3):
                start = time.perf_counter()
                with transaction.atomic():
                    cursor.execute("INSERT INTO bench_commit VALUES (%s)", [n])
                baseline.append((time.perf_counter() - start) * 1000)
        finally:
            cursor.execute("DROP TABLE bench_commit")
    return {
        "instances": instances,
        "steps_per_instance": 3,
        "runs_ms_per_step": per_step,
        "ms_per_step": statistics.median(per_step),
        "commit_ms": statistics.median(baseline),
    }
