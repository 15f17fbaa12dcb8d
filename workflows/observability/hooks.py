"""What workflows tell observers (metrics and tracing), without importing OpenTelemetry
or prometheus-client: spans through :mod:`ledon.tracing` (``WORKFLOWS["TRACING"]``) and
signals that the optional metrics layer (:mod:`workflows.observability.metrics`) counts."""

from __future__ import annotations

import logging

from django.dispatch import Signal

from ledon.errors import send_logged
from ledon.tracing import Tracer, tracer

logger = logging.getLogger(__name__)

#: A run was created (not an existing run returned): ``name``, ``version``.
run_started = Signal()
#: A run ended while a driver of this process advanced (or cancelled) it: ``name``,
#: ``version`` and ``outcome`` ("succeeded", "failed" or "cancelled").
run_finished = Signal()
#: An inline step's try ended in this process: ``name`` (the workflow's), ``kind``,
#: ``outcome`` ("succeeded" or "failed") and ``seconds``.
step_finished = Signal()


def workflows_tracer() -> Tracer:
    """The workflows' tracer: a no-op unless ``WORKFLOWS["TRACING"]``."""
    return tracer("workflows")


def started(name: str, version: int) -> None:
    send_logged(run_started, None, "run_started", log=logger, name=name, version=version)


def finished(name: str, version: int, outcome: str) -> None:
    send_logged(
        run_finished, None, "run_finished", log=logger, name=name, version=version, outcome=outcome
    )


def step_ended(name: str, kind: str, outcome: str, seconds: float) -> None:
    send_logged(
        step_finished,
        None,
        "step_finished",
        log=logger,
        name=name,
        kind=kind,
        outcome=outcome,
        seconds=seconds,
    )
