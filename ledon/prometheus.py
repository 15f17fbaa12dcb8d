"""Prometheus metrics of the apps (the ``[metrics]`` extra: prometheus-client).

Imported only when metrics are on: ``JOBS["METRICS"]`` (or OUTBOX's, SAGAS',
WORKFLOWS'), an engine's ``--metrics-port``, or a request to
:func:`ledon.metrics.metrics_view`. The metrics live in prometheus-client's default
registry, beside the project's own.

- **Counters and histograms** are counted by each process from the apps' signals and
  the jobs middleware (``<app>.observability.metrics``): a worker counts the attempts it
  ran, a web process the jobs it enqueued.
- **Gauges** are read from the database at scrape time by one collector: each app
  adds its *source* (a function returning metric families), each source one or a few
  indexed queries (see ``docs/operations.md``). A source whose database fails is
  left out of that scrape and counted in ``ledon_scrape_errors_total``.

:func:`serve` is ``--metrics-port`` (with ``--metrics-address``), which answers
``/metrics`` alone; the Django view a project routes is
:func:`ledon.metrics.metrics_view`, which imports this module only when it answers.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.apps import apps
from django.db import DatabaseError, connections
from django.dispatch import Signal
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Histogram,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

#: Buckets of the wait and run-time histograms, in seconds: from a fast job's few
#: milliseconds to an hour.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

JOBS_ENQUEUED = Counter(
    "ledon_jobs_enqueued", "Jobs created (submitted or staged and committed).", ["queue", "handler"]
)
JOBS_FINISHED = Counter(
    "ledon_jobs_finished",
    "Attempts that ended, by how: succeeded, failed, retried (failed, queued again), "
    "cancelled, interrupted, requeued (shutdown), keeps_killing_worker (shutdown, the "
    "crash budget reached), put_back (unknown handler), snoozed, released, stale.",
    ["queue", "handler", "outcome"],
)
JOBS_HELD_BACK = Counter(
    "ledon_jobs_held_back",
    "Due jobs a claim left Queued because a limit had no room for them, by the rule "
    "that held them (handler.max_running, queue.rate_per_key…). A job held by several "
    "claims counts once per claim.",
    ["queue", "handler", "rule"],
)
JOBS_KEEPS_KILLING_WORKER = Counter(
    "ledon_jobs_keeps_killing_worker",
    "Jobs ended Interrupted as ones that keep killing their worker: their attempts were "
    "recovered (worker died, or outlived its shutdown's grace) JOBS['MAX_INTERRUPTIONS'] "
    "times. Counted by the process that recovered the last one.",
    ["queue", "handler"],
)
#: The two timings of an attempt, with the same labels and buckets.
JOB_WAIT, JOB_RUN = (
    Histogram(name, text, ["queue", "handler"], buckets=BUCKETS)
    for name, text in (
        ("ledon_job_wait_seconds", "Seconds from a job's due time to the start of its attempt."),
        (
            "ledon_job_run_seconds",
            "Seconds an attempt's handler ran (the middleware chain included).",
        ),
    )
)
OUTBOX_MESSAGES = Counter(
    "ledon_outbox_messages",
    "Outbox deliveries recorded by dispatchers: sent, retried (retry scheduled), parked, "
    "stale (the batch's lease was lost).",
    ["event_type", "outcome"],
)
OUTBOX_CONSUMED = Counter(
    "ledon_outbox_consumed",
    "Messages a consumer is done with: handled, duplicate, skipped, parked, abandoned.",
    ["group", "event_type", "outcome"],
)
SAGAS_FINISHED = Counter(
    "ledon_sagas_finished",
    "Saga instances that ended: succeeded, compensated, needs_attention.",
    ["saga", "outcome"],
)
SCRAPE_ERRORS = Counter(
    "ledon_scrape_errors",
    "Gauge sources left out of a scrape because their database query failed.",
    ["source"],
)

#: A gauge source: the metric families it reads now.
Source = Callable[[], Iterable[Metric]]

_sources: dict[str, Source] = {}
_lock = threading.Lock()
_collector_registered = False


class DatabaseCollector(Collector):
    """Reads every source at scrape time, and how long that took."""

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        for name, source in sorted(sources().items()):
            try:
                with _scrape_connections():
                    families = list(source())
            except DatabaseError as exc:
                SCRAPE_ERRORS.labels(name).inc()
                logger.warning(
                    "metrics: the %s gauges were left out of this scrape: %s",
                    name,
                    exc,
                    extra={"source": name},
                )
                continue
            yield from families
        duration = GaugeMetricFamily(
            "ledon_scrape_duration_seconds",
            "Seconds the database gauges of this scrape took to read.",
        )
        duration.add_metric([], time.perf_counter() - started)
        yield duration

    def describe(self) -> Iterable[Metric]:
        return []  # read at scrape time only, never at registration


class _scrape_connections:
    """A scrape on a thread that had no database connection open (the metrics
    server's) closes what it opened; a request thread keeps its own."""

    def __enter__(self) -> None:
        self._opened = [c.alias for c in connections.all() if c.connection is None]

    def __exit__(self, *exc: object) -> None:
        for alias in self._opened:
            if not connections[alias].in_atomic_block:
                connections[alias].close()


def add_source(name: str, source: Source) -> None:
    """Add (or replace) the gauge source ``name``; the collector joins the registry
    the first time."""
    global _collector_registered
    with _lock:
        _sources[name] = source
        if not _collector_registered:
            REGISTRY.register(DatabaseCollector())
            _collector_registered = True


def sources() -> dict[str, Source]:
    """The gauge sources each scrape reads, by name."""
    with _lock:
        return dict(_sources)


def remove_source(name: str) -> None:
    with _lock:
        _sources.pop(name, None)


@dataclass(frozen=True, slots=True)
class AppMetrics:
    """One app's metrics: the signals it counts from — (signal, receiver, dispatch
    uid) — and its gauge source, connected by :meth:`install` (idempotent) and
    disconnected by :meth:`uninstall`."""

    name: str
    gauges: Source
    receivers: tuple[tuple[Signal, Callable[..., None], str], ...]

    def install(self) -> None:
        for signal, receiver, uid in self.receivers:
            signal.connect(receiver, dispatch_uid=uid)
        add_source(self.name, self.gauges)

    def uninstall(self) -> None:
        for signal, _receiver, uid in self.receivers:
            signal.disconnect(dispatch_uid=uid)
        remove_source(self.name)


def enable_all() -> None:
    """Turn on the metrics of every installed app that has them (each app config's
    ``optional_layers``, a :class:`ledon.observability.OptionalLayers`), whatever their
    settings say: ``--metrics-port`` and the view do this."""
    for config in apps.get_app_configs():
        layers = getattr(config, "optional_layers", None)
        if layers is not None:
            layers.enable_metrics()


#: The one path the metrics server answers.
METRICS_PATH = "/metrics"


class _QuietHandler(WSGIRequestHandler):
    """No line on stderr for every scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def metrics_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The WSGI application of :func:`serve`: the metrics at ``/metrics``, 404 elsewhere
    (a scraper pointed at the wrong path should fail, not read metrics from it)."""
    if environ.get("PATH_INFO") != METRICS_PATH:
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"Not found: the metrics are at {METRICS_PATH}\n".encode()]
    served: Iterable[bytes] = _exposition(environ, start_response)
    return served


_exposition = make_wsgi_app(REGISTRY)


def serve(port: int, address: str) -> WSGIServer:
    """Serve ``/metrics`` on ``address``:``port`` (port 0: a free one) from a thread of
    this process; returns the server (``server_port``; ``shutdown()`` stops it). An
    address that cannot be bound is an :class:`OSError`."""
    enable_all()
    infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, *_rest, sockaddr = infos[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(str(sockaddr[0]), port, metrics_app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True).start()
    return server


def exposition() -> tuple[bytes, str]:
    """What :func:`ledon.metrics.metrics_view` answers: every installed app's metrics
    turned on, then the registry in Prometheus' text format, and its content type."""
    enable_all()
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def labels_of(*values: Any) -> list[str]:
    """Label values as text (a label value may not be None)."""
    return ["" if value is None else str(value) for value in values]
