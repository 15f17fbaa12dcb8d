"""Shared helpers of the saga tests: order data, reading the side-effect counter and
journal, and management commands in child processes."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from sagas import start_saga, store
from sagas.driver import Driver
from sagas.models import SagaInstance
from sagas.registry import get_saga
from testproject.fulfilment.models import StepRun

#: Data of one order for the fulfilment sagas.
ORDER: dict[str, Any] = {"order_id": 7, "sku": "SKU-1", "quantity": 2, "amount": "19.90"}

#: Child processes: short leases, so that tests wait for expiry briefly.
FAST = {
    "SAGAS_LEASE_SECONDS": "1",
    "SAGAS_POLL_INTERVAL": "0.1",
    "SAGAS_COMPENSATION_RETRY_DELAY": "0",
}


def order(**extra: Any) -> dict[str, Any]:
    return {**ORDER, **extra}


def runs(instance_id: uuid.UUID, kind: str = "action") -> list[str]:
    """The committed runs of steps (or compensations) of one instance, in order."""
    return list(
        StepRun.objects.filter(instance_id=instance_id, kind=kind)
        .order_by("id")
        .values_list("step", flat=True)
    )


def journal(path: Path) -> list[tuple[str, str, str, str, int]]:
    """Lines of the fulfilment journal: (instance, step, kind, start|end, pid)."""
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(i, s, k, e, int(p)) for i, s, k, e, p in lines]


def started(path: Path, kind: str = "action") -> Counter[str]:
    """How often each step's action (or compensation) started, committed or not."""
    return Counter(s for _, s, k, e, _ in journal(path) if k == kind and e == "start")


def instance(instance_id: uuid.UUID | str | None = None) -> SagaInstance:
    if instance_id is None:
        return SagaInstance.objects.get()
    return SagaInstance.objects.get(instance_id=instance_id)


def stopped_after_reserve(**data: Any) -> uuid.UUID:
    """An instance whose runner completed reserve, then stopped and freed the lease."""
    state = start_saga("fulfilment.order", data=order(**data))
    stopping = threading.Event()
    claimed = store.claim(state, "gone", lease_seconds=30)
    Driver(
        get_saga("fulfilment.order"),
        "gone",
        on_event=lambda e, s, d: stopping.set() if e == "step-completed" else None,
        stopping=stopping,
    ).drive(claimed)
    return state.instance_id
