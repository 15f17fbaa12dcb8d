"""What the engines' management commands share: the engine runs with each signal as a
stop request (and a line saying what it does), and a database without the app's
tables is a :class:`~django.core.management.CommandError` — two lines, no traceback;
the engine's summary line when it stops; and ``--metrics-port``, which serves the
Prometheus metrics while the engine runs (SPEC M)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.core.management.base import CommandError, CommandParser

from .db import DatabaseNotMigrated
from .engine import Engine, EngineStats, StopLevel


def add_metrics_port(parser: CommandParser) -> None:
    """The ``--metrics-port`` option of every engine's command."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="N",
        help="serve Prometheus metrics at http://<host>:N/metrics while running (0: a free "
        "port, printed); needs the [metrics] extra",
    )


def serve_metrics(port: int, *, out: Any, name: str) -> Any:
    """Start the metrics server of ``--metrics-port`` and say where it listens."""
    if not 0 <= port <= 65535:
        raise CommandError("--metrics-port must be between 0 and 65535")
    try:
        from . import metrics  # the [metrics] extra, needed only with --metrics-port
    except ImportError as exc:
        raise CommandError(
            f"--metrics-port needs prometheus-client: pip install 'django-ledon[metrics]' ({exc})"
        ) from None
    try:
        server = metrics.serve(port)
    except OSError as exc:
        raise CommandError(f"--metrics-port {port}: {exc}") from None
    out.write(f"{name}: metrics on http://0.0.0.0:{server.server_port}/metrics")
    out.flush()
    return server


def run_engine[S: EngineStats](
    engine: Engine,
    run: Callable[[], S],
    *,
    out: Any,
    name: str,
    meaning: Mapping[StopLevel, str],
    style: Callable[[str], str],
    metrics_port: int | None = None,
) -> S:
    """``run()`` (the engine's) with SIGTERM and SIGINT as stop requests; each is
    announced on ``out`` as ``"<name>: SIGTERM, <meaning of the level reached>"``.
    At the end, ``"<name> stopped: <the stats' summary>"`` on ``out`` (``style``
    applied: the command's ``self.style.SUCCESS``). With ``metrics_port``, the
    metrics are served meanwhile (:func:`serve_metrics`)."""
    server = None if metrics_port is None else serve_metrics(metrics_port, out=out, name=name)

    def announce(signum: Any, level: StopLevel) -> None:
        out.write(f"{name}: {signum.name}, {meaning[level]}")
        out.flush()

    try:
        with engine.stop_on_signals(announce):
            stats = run()
    except DatabaseNotMigrated as exc:
        raise CommandError(str(exc)) from exc
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    out.write(style(f"{name} stopped: {stats.summary()}"))
    return stats
