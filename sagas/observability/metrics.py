"""Prometheus metrics of sagas (``SAGAS["METRICS"]``, ``[metrics]``).

- ``ledon_sagas_finished_total{saga,outcome}`` — instances that ended while a runner
  of this process drove them (:data:`sagas.observability.hooks.saga_finished`);
- at scrape time, one query over the ``(status, name)`` index:
  ``ledon_sagas{saga,status}`` for the statuses that are not final (running,
  compensating, failed — needing attention). Finished instances are counted by the
  counter, not read: they only grow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from ledon import metrics

from ..types import SagaSnapshot
from .hooks import saga_finished
from .reads import open_instances


def _count_finished(sender: Any, *, state: SagaSnapshot, outcome: str, **kwargs: Any) -> None:
    metrics.SAGAS_FINISHED.labels(state.name, outcome).inc()


def gauges() -> Iterable[Metric]:
    family = GaugeMetricFamily(
        "ledon_sagas",
        "Saga instances that are running, compensating or failed (needing attention).",
        labels=["saga", "status"],
    )
    for row in open_instances():
        family.add_metric([row["name"], row["status"]], row["count"])
    return [family]


#: The sagas' counters and gauges, on while SAGAS["METRICS"] (or ``--metrics-port``) says.
APP_METRICS = metrics.AppMetrics(
    "sagas", gauges, ((saga_finished, _count_finished, "sagas.metrics.finished"),)
)
