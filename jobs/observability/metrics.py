"""Prometheus metrics of jobs (``JOBS["METRICS"]``, the ``[metrics]`` extra).

- ``ledon_jobs_enqueued_total{queue,handler}`` — from :data:`jobs.signals.jobs_enqueued`
  (staged jobs when their transaction commits);
- ``ledon_jobs_finished_total{queue,handler,outcome}`` — from
  :data:`jobs.signals.attempt_finished`, and with ``outcome="expired"`` from
  :data:`jobs.signals.jobs_expired` (jobs not started by their deadline);
- ``ledon_jobs_held_back_total{queue,handler,rule}`` — from
  :data:`jobs.signals.jobs_held_back` (due jobs a claim left Queued, by the limit that
  had no room for them);
- ``ledon_jobs_keeps_killing_worker_total{queue,handler}`` — from
  :data:`jobs.signals.job_keeps_killing_worker` (the crash budget reached);
- ``ledon_job_wait_seconds{queue,handler}`` (due → start) and
  ``ledon_job_run_seconds{queue,handler}`` — from :func:`metrics_middleware`;
- at scrape time, from the database (:mod:`jobs.observability.reads`):
  ``ledon_jobs_queued{queue}``, ``ledon_jobs_running{queue}``,
  ``ledon_jobs_oldest_due_age_seconds{queue}``, ``ledon_workers{kind,state}``,
  ``ledon_jobs_batches{state}`` (``open``, ``done``) and
  ``ledon_jobs_sequences_halted``.

A gauge reads 0, rather than disappearing, for every queue known
(:func:`jobs.observability.reads.known_queues`, and every queue an earlier scrape of this
process saw) and every kind of engine, so that an alert on "no worker live" or a
graph of a queue that drained sees a 0.

The wait and run histograms come from the middleware, which the chain includes
whenever the jobs' metrics are on: by ``JOBS["METRICS"]`` or by ``--metrics-port``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone
from django.utils.decorators import sync_and_async_middleware
from prometheus_client.core import GaugeMetricFamily, Metric

from ledon import prometheus
from ledon.metrics import metrics_view

from ..signals import (
    attempt_finished,
    job_keeps_killing_worker,
    jobs_enqueued,
    jobs_expired,
    jobs_held_back,
)
from ..types import Claim, FinishOutcome, JobSnapshot
from . import reads

if TYPE_CHECKING:
    from ..handlers import JobContext

__all__ = ["APP_METRICS", "metrics_middleware", "metrics_view"]


def _waited(claim: Claim) -> None:
    if claim.due_at is not None:
        waited = (timezone.now() - claim.due_at).total_seconds()
        prometheus.JOB_WAIT.labels(claim.queue, claim.handler).observe(max(waited, 0.0))


def _ran(claim: Claim, started: float) -> None:
    prometheus.JOB_RUN.labels(claim.queue, claim.handler).observe(time.perf_counter() - started)


@sync_and_async_middleware
def metrics_middleware(call_next: Callable[..., Any]) -> Callable[..., Any]:
    """The middleware ``JOBS["METRICS"]`` adds: each attempt's wait and run time."""
    if inspect.iscoroutinefunction(call_next):

        async def async_middleware(ctx: JobContext) -> Any:
            _waited(ctx.claim)
            started = time.perf_counter()
            try:
                return await call_next(ctx)
            finally:
                _ran(ctx.claim, started)

        return async_middleware

    def middleware(ctx: JobContext) -> Any:
        _waited(ctx.claim)
        started = time.perf_counter()
        try:
            return call_next(ctx)
        finally:
            _ran(ctx.claim, started)

    return middleware


def _count_enqueued(
    sender: Any, *, snapshots: list[JobSnapshot], staged: bool, using: str, **kwargs: Any
) -> None:
    def count() -> None:
        for snap in snapshots:
            prometheus.JOBS_ENQUEUED.labels(snap.queue, snap.handler).inc()

    if staged:
        transaction.on_commit(count, using=using)
    else:
        count()


def outcome_label(outcome: FinishOutcome, *, retry_scheduled: bool) -> str:
    """The ``outcome`` label of a finished attempt."""
    return "retried" if retry_scheduled else outcome.value.replace("-", "_")


def _count_finished(
    sender: Any, *, claim: Claim, outcome: FinishOutcome, retry_scheduled: bool, **kwargs: Any
) -> None:
    label = outcome_label(outcome, retry_scheduled=retry_scheduled)
    prometheus.JOBS_FINISHED.labels(claim.queue, claim.handler, label).inc()


def _count_kept_killing(sender: Any, *, queue: str, handler: str, **kwargs: Any) -> None:
    prometheus.JOBS_KEEPS_KILLING_WORKER.labels(queue, handler).inc()


def _count_expired(sender: Any, *, jobs: list[tuple[str, str]], **kwargs: Any) -> None:
    for queue, handler in jobs:
        prometheus.JOBS_FINISHED.labels(queue, handler, "expired").inc()


def _count_held_back(sender: Any, *, held: list[tuple[str, str, str, int]], **kwargs: Any) -> None:
    for queue, handler, rule, count in held:
        prometheus.JOBS_HELD_BACK.labels(queue, handler, rule).inc(count)


#: Queues an earlier scrape of this process reported: they keep a series, at 0.
_seen_queues: set[str] = set()


def gauges() -> Iterable[Metric]:
    """The jobs' gauges, read now (three indexed queries and the registry's rows)."""
    now = timezone.now()
    states = {state.queue: state for state in reads.queue_states(now)}
    _seen_queues.update(states)
    _seen_queues.update(reads.known_queues())
    queued = GaugeMetricFamily(
        "ledon_jobs_queued",
        "Queued jobs in line, per queue (not those held behind their sequence).",
        labels=["queue"],
    )
    running = GaugeMetricFamily("ledon_jobs_running", "Running jobs, per queue.", labels=["queue"])
    oldest = GaugeMetricFamily(
        "ledon_jobs_oldest_due_age_seconds",
        "Seconds the longest-waiting due job has waited, per queue.",
        labels=["queue"],
    )
    for name in sorted(_seen_queues):
        state = states.get(name) or reads.QueueState(queue=name)
        queued.add_metric([state.queue], state.queued)
        running.add_metric([state.queue], state.running)
        oldest.add_metric([state.queue], state.oldest_due_age(now))
    workers = GaugeMetricFamily(
        "ledon_workers",
        "Engines in the workers registry, by kind and state (live, unhealthy, silent).",
        labels=["kind", "state"],
    )
    counts = {(kind, state): 0 for kind in reads.ENGINE_KINDS for state in reads.WORKER_STATES}
    counts.update(reads.worker_counts(now))
    for (kind, engine_state), count in sorted(counts.items()):
        workers.add_metric([kind, engine_state], count)
    batches = GaugeMetricFamily(
        "ledon_jobs_batches",
        "Batches by state: open (a job of it not final yet) or done.",
        labels=["state"],
    )
    for batch_state, count in sorted(reads.batch_counts().items()):
        batches.add_metric([batch_state], count)
    halted = GaugeMetricFamily(
        "ledon_jobs_sequences_halted",
        "Sequences halted by a Failed job, waiting for an operator to retry or cancel it.",
    )
    halted.add_metric([], reads.halted_sequences())
    return [queued, running, oldest, workers, batches, halted]


#: The jobs' counters and gauges, on while JOBS["METRICS"] (or ``--metrics-port``) says.
APP_METRICS = prometheus.AppMetrics(
    "jobs",
    gauges,
    (
        (jobs_enqueued, _count_enqueued, "jobs.metrics.enqueued"),
        (attempt_finished, _count_finished, "jobs.metrics.finished"),
        (job_keeps_killing_worker, _count_kept_killing, "jobs.metrics.keeps_killing_worker"),
        (jobs_expired, _count_expired, "jobs.metrics.expired"),
        (jobs_held_back, _count_held_back, "jobs.metrics.held_back"),
    ),
)
