"""Prometheus metrics of workflows (``WORKFLOWS["METRICS"]``, the ``[metrics]`` extra).

- ``ledon_workflow_runs_started_total{workflow}`` — runs created by this process;
- ``ledon_workflow_runs_finished_total{workflow,outcome}`` — runs that ended while a
  driver of this process advanced or cancelled them;
- ``ledon_workflow_step_seconds{workflow,kind,outcome}`` — inline steps' tries;
- at scrape time, one query over the ``(status, name, version)`` index:
  ``ledon_workflow_runs{workflow,status}`` for the runs not finished (running,
  waiting).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Count
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from ledon import prometheus

from ..models import WorkflowRun
from .hooks import run_finished, run_started, step_finished

RUNS_STARTED = Counter("ledon_workflow_runs_started", "Workflow runs created.", ["workflow"])
RUNS_FINISHED = Counter(
    "ledon_workflow_runs_finished",
    "Workflow runs that ended: succeeded, failed, cancelled.",
    ["workflow", "outcome"],
)
STEP_SECONDS = Histogram(
    "ledon_workflow_step_seconds",
    "Seconds an inline step's try took.",
    ["workflow", "kind", "outcome"],
    buckets=prometheus.BUCKETS,
)


def _started(sender: Any, *, name: str, **kwargs: Any) -> None:
    RUNS_STARTED.labels(name).inc()


def _finished(sender: Any, *, name: str, outcome: str, **kwargs: Any) -> None:
    RUNS_FINISHED.labels(name, outcome).inc()


def _step(sender: Any, *, name: str, kind: str, outcome: str, seconds: float, **kw: Any) -> None:
    STEP_SECONDS.labels(name, kind, outcome).observe(seconds)


def gauges() -> Iterable[Metric]:
    family = GaugeMetricFamily(
        "ledon_workflow_runs",
        "Workflow runs not finished, by status (running, waiting).",
        labels=["workflow", "status"],
    )
    rows = (
        WorkflowRun.objects.unfinished()
        .values_list("name", "status")
        .annotate(count=Count("id"))
        .order_by()
    )
    for name, status, count in rows:
        family.add_metric([name, status], count)
    return [family]


#: The workflows' counters and gauges, on while WORKFLOWS["METRICS"] (or
#: ``--metrics-port``) says.
APP_METRICS = prometheus.AppMetrics(
    "workflows",
    gauges,
    (
        (run_started, _started, "workflows.metrics.started"),
        (run_finished, _finished, "workflows.metrics.finished"),
        (step_finished, _step, "workflows.metrics.step"),
    ),
)
