"""What sagas tell observers, without importing OpenTelemetry or
prometheus-client: a span per step and per compensation through :mod:`ledon.tracing`
(``SAGAS["TRACING"]``), and :data:`saga_finished` when an instance ends."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from django.dispatch import Signal

from ledon.errors import send_logged
from ledon.tracing import Carrier, Span, tracer

from ..types import SagaSnapshot

#: A saga instance ended while a runner drove it: ``sender=SagaSnapshot``, ``state``
#: (the instance before its last change) and ``outcome``: ``"succeeded"``,
#: ``"compensated"`` or ``"needs_attention"`` (a compensation kept failing).
saga_finished = Signal()

#: The driver's events that end an instance, and the outcome each means.
FINISHING_EVENTS = {
    "succeeded": "succeeded",
    "compensated": "compensated",
    "needs-attention": "needs_attention",
}


def trace_context() -> Carrier:
    """The calling thread's trace context, for the spans of steps run elsewhere."""
    return tracer("sagas").current()


@contextmanager
def step_span(
    state: SagaSnapshot,
    step: str,
    compensating: bool,
    attempt: int,
    parent: Mapping[str, str],
) -> Iterator[Span]:
    """The span of one step or compensation (its errors are recorded on it)."""
    what = "compensate" if compensating else "step"
    with tracer("sagas").span(
        f"sagas.{what} {state.name}.{step}",
        parent=parent,
        attributes={
            "ledon.saga.name": state.name,
            "ledon.saga.instance_id": str(state.instance_id),
            "ledon.saga.step": step,
            "ledon.saga.compensating": compensating,
            "ledon.saga.attempt": attempt,
        },
    ) as span:
        yield span


def instance_finished(state: SagaSnapshot, event: str) -> None:
    """Send :data:`saga_finished` for the driver's ``event`` (one of FINISHING_EVENTS)."""
    send_logged(
        saga_finished, SagaSnapshot, "saga_finished", state=state, outcome=FINISHING_EVENTS[event]
    )
