"""What the engines' management commands share: the engine runs with each signal as a
stop request (and a line saying what it does), and a database without the app's
tables is a :class:`~django.core.management.CommandError` — two lines, no traceback;
and the engine's summary line when it stops."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.core.management.base import CommandError

from .db import DatabaseNotMigrated
from .engine import Engine, EngineStats, StopLevel


def run_engine[S: EngineStats](
    engine: Engine,
    run: Callable[[], S],
    *,
    out: Any,
    name: str,
    meaning: Mapping[StopLevel, str],
    style: Callable[[str], str],
) -> S:
    """``run()`` (the engine's) with SIGTERM and SIGINT as stop requests; each is
    announced on ``out`` as ``"<name>: SIGTERM, <meaning of the level reached>"``.
    At the end, ``"<name> stopped: <the stats' summary>"`` on ``out`` (``style``
    applied: the command's ``self.style.SUCCESS``)."""

    def announce(signum: Any, level: StopLevel) -> None:
        out.write(f"{name}: {signum.name}, {meaning[level]}")
        out.flush()

    try:
        with engine.stop_on_signals(announce):
            stats = run()
    except DatabaseNotMigrated as exc:
        raise CommandError(str(exc)) from exc
    out.write(style(f"{name} stopped: {stats.summary()}"))
    return stats
