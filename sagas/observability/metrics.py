"""Prometheus metrics of sagas (``SAGAS["METRICS"]``, ``[metrics]``).

- ``ledon_sagas_finished_total{saga,outcome}`` — instances that ended while a runner
  of this process drove them (:data:`sagas.observability.hooks.saga_finished`);
- at scrape time, one query over the ``(status, name)`` index:
  ``ledon_sagas{saga,status}`` for the statuses that are not final (running,
  compensating, failed — needing attention). Finished instances are counted by the
  counter, not read: they only grow. Every saga registered in this process (or seen by
  an earlier scrape) has a series for each of those statuses, 0 when none is in it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from ledon import prometheus

from ..registry import registered_sagas
from ..types import SagaSnapshot
from .hooks import saga_finished
from .reads import OPEN_STATUSES, open_instances


def _count_finished(sender: Any, *, state: SagaSnapshot, outcome: str, **kwargs: Any) -> None:
    prometheus.SAGAS_FINISHED.labels(state.name, outcome).inc()


def gauges() -> Iterable[Metric]:
    family = GaugeMetricFamily(
        "ledon_sagas",
        "Saga instances that are running, compensating or failed (needing attention).",
        labels=["saga", "status"],
    )
    counts = {(row["name"], row["status"]): row["count"] for row in open_instances()}
    _seen_sagas.update(name for name, _status in counts)
    _seen_sagas.update(definition.name for definition in registered_sagas())
    for name in sorted(_seen_sagas):
        for status in OPEN_STATUSES:
            family.add_metric([name, status.value], counts.get((name, status.value), 0))
    return [family]


#: Sagas an earlier scrape of this process reported: they keep their series, at 0.
_seen_sagas: set[str] = set()


#: The sagas' counters and gauges, on while SAGAS["METRICS"] (or ``--metrics-port``) says.
APP_METRICS = prometheus.AppMetrics(
    "sagas", gauges, ((saga_finished, _count_finished, "sagas.metrics.finished"),)
)
