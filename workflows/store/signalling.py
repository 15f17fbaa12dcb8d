"""Signals: a signal recorded for a run, kept until its wait reads it, waking the run
if it waits for it."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F

from ledon.faults import fault_point

from ..exceptions import SignalConflict
from ..models import WorkflowRun, WorkflowSignal
from ..types import RunStatus, SignalOutcome, WaitKind
from ..validation import from_json
from .base import alias, current_time, run_in_scope
from .waking import wake


def send_signal(scope_hash: str, run_id: str, key: str, payload_json: str) -> SignalOutcome:
    """Record a signal for a run and wake the run unless it waits for something else.

    Works in its own transaction or inside the caller's (then it is delivered only if
    that commits). The run row is locked first, so a driver that is about to wait for
    this key either sees the signal or is woken by it.
    """
    now = current_time()
    with transaction.atomic(using=alias()):
        run = run_in_scope(scope_hash, run_id)
        # Lock the run row (an unconditional touch): orders this transaction with the
        # driver's fenced writes.
        WorkflowRun.objects.filter(pk=run.pk).update(updated_at=F("updated_at"))
        run.refresh_from_db(fields=["status", "wait_kind", "wait_key", "generation"])
        existing = WorkflowSignal.objects.filter(run=run, key=key).first()
        if existing is not None:
            if existing.payload_json != payload_json:
                raise SignalConflict(
                    f"signal {key!r} was already sent to run {run_id!r} with another payload"
                )
            return SignalOutcome.ALREADY_SENT
        if run.status in RunStatus.finished():
            return SignalOutcome.RUN_FINISHED
        WorkflowSignal.objects.create(run=run, key=key, payload_json=payload_json, created_at=now)
        fault_point("workflows.signal.deliver", run=run.pk, key=key)
        if run.status == RunStatus.RUNNING:
            # The driver replays once more before it waits (see suspend).
            WorkflowRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
                wake_pending=True
            )
        elif run.wait_kind == WaitKind.SIGNAL and run.wait_key == key:
            wake(run.pk, run.generation, "signal", key, now=now)
        # Waiting for anything else (its first advance, a timer, items…): the run
        # reads the kept signal when its body reaches the wait.
    return SignalOutcome.DELIVERED


def signal_payload(run_pk: int, key: str) -> tuple[bool, Any]:
    """Whether signal ``key`` was sent to run ``run_pk``, and its payload."""
    payload = (
        WorkflowSignal.objects.filter(run_id=run_pk, key=key)
        .values_list("payload_json", flat=True)
        .first()
    )
    return (payload is not None, from_json(payload))
