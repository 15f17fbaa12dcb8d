"""The metrics endpoint of ``run_jobs --processes N --metrics-port P`` (the
``[metrics]`` extra).

The supervisor alone serves the port: its children count into a shared directory
(prometheus-client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``), and the
database gauges are read once per scrape, by the supervisor. Loaded only when
``--metrics-port`` is given, so that ``run_jobs`` works without prometheus-client.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from ledon import prometheus


class SupervisorMetrics:
    """The shared directory of the children's counters and the HTTP server that
    reads it. :meth:`close` stops the server and removes the directory."""

    def __init__(self, port: int) -> None:
        #: Where the children count: their ``PROMETHEUS_MULTIPROC_DIR``.
        self.directory = tempfile.mkdtemp(prefix="ledon-metrics-")
        prometheus.enable_all()  # the database gauges' sources
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
        registry.register(prometheus.DatabaseCollector())
        self.server: Any
        self.server, _thread = start_http_server(port, registry=registry)

    @property
    def port(self) -> int:
        """The port served (the one asked for, or the one chosen for 0)."""
        return int(self.server.server_port)

    def forget(self, pid: int) -> None:
        """A child exited: its live gauges no longer count."""
        mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        """Stop serving and remove the shared directory."""
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)


def enable_in_child() -> None:
    """In a child: count the worker's metrics (into the supervisor's directory)."""
    prometheus.enable_all()
