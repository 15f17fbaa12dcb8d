"""Prometheus metrics of the outbox (``OUTBOX["METRICS"]``, ``[metrics]``).

- ``ledon_outbox_messages_total{event_type,outcome}`` — deliveries recorded by
  dispatchers (:data:`outbox.signals.deliveries_recorded`);
- ``ledon_outbox_consumed_total{group,event_type,outcome}`` — messages consumers are
  done with (:data:`outbox.signals.message_consumed`);
- at scrape time, one query over the ``(status, event_type)`` index:
  ``ledon_outbox_pending``, ``ledon_outbox_oldest_pending_age_seconds`` and
  ``ledon_outbox_parked``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from ledon import prometheus

from ..signals import deliveries_recorded, message_consumed
from ..types import ConsumeOutcome, Envelope, RecordOutcome
from .reads import backlog

_OUTCOMES = {
    RecordOutcome.SENT: "sent",
    RecordOutcome.RETRY_SCHEDULED: "retried",
    RecordOutcome.PARKED: "parked",
    RecordOutcome.STALE: "stale",
}


def _count_deliveries(
    sender: Any,
    *,
    outcomes: Mapping[Any, RecordOutcome],
    messages: Sequence[Envelope],
    **kwargs: Any,
) -> None:
    types = {m.message_id: m.event_type for m in messages}
    for message_id, outcome in outcomes.items():
        prometheus.OUTBOX_MESSAGES.labels(types.get(message_id, ""), _OUTCOMES[outcome]).inc()


def _count_consumed(
    sender: Any, *, consumer: Any, envelope: Envelope | None, outcome: ConsumeOutcome, **kw: Any
) -> None:
    event_type = envelope.event_type if envelope is not None else ""
    prometheus.OUTBOX_CONSUMED.labels(consumer.group, event_type, outcome.value).inc()


def gauges() -> Iterable[Metric]:
    state = backlog()
    pending = GaugeMetricFamily("ledon_outbox_pending", "Outbox messages waiting for delivery.")
    pending.add_metric([], state.pending)
    lag = GaugeMetricFamily(
        "ledon_outbox_oldest_pending_age_seconds",
        "Seconds since the oldest pending outbox message was stored (the outbox's lag).",
    )
    lag.add_metric([], state.lag(timezone.now()))
    parked = GaugeMetricFamily(
        "ledon_outbox_parked", "Parked outbox messages (waiting for an operator)."
    )
    parked.add_metric([], state.parked)
    return [pending, lag, parked]


#: The outbox's counters and gauges, on while OUTBOX["METRICS"] (or ``--metrics-port``) says.
APP_METRICS = prometheus.AppMetrics(
    "outbox",
    gauges,
    (
        (deliveries_recorded, _count_deliveries, "outbox.metrics.deliveries"),
        (message_consumed, _count_consumed, "outbox.metrics.consumed"),
    ),
)
