"""What the engines' management commands share: the engine runs with each signal as a
stop request (and a line saying what it does), and a database without the app's
tables is a :class:`~django.core.management.CommandError` — two lines, no traceback;
the engine's summary line when it stops; ``--metrics-port`` (and
``--metrics-address``), which serves the Prometheus metrics while the engine runs; and
:class:`EngineCommand`, the base of the four engines' commands (``run_jobs``,
``dispatch_outbox``, ``consume_events``, ``recover_sagas``)."""

from __future__ import annotations

import gc
import socket
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

from django.core.management.base import BaseCommand, CommandError, CommandParser

from .checks import ENGINES
from .db import DatabaseNotMigrated
from .engine import Engine, EngineStats, StopLevel

#: Where ``--metrics-port`` listens unless ``--metrics-address`` says otherwise: this
#: machine only (the metrics name queues, handlers and hosts). ``0.0.0.0`` or ``::``
#: listens on every interface.
DEFAULT_METRICS_ADDRESS = "127.0.0.1"


def add_metrics_port(parser: CommandParser) -> None:
    """The ``--metrics-port`` and ``--metrics-address`` options of every engine's command."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="N",
        help="serve Prometheus metrics at http://ADDRESS:N/metrics while running (0: a free "
        "port, printed); needs the [metrics] extra",
    )
    parser.add_argument(
        "--metrics-address",
        default=DEFAULT_METRICS_ADDRESS,
        metavar="ADDRESS",
        help="the address --metrics-port listens on (default: %(default)s, this machine "
        "only; 0.0.0.0 or :: for every interface)",
    )


def check_metrics_options(options: Mapping[str, Any]) -> None:
    """Refuse a bad ``--metrics-port`` or ``--metrics-address`` (or a missing
    prometheus-client) before the engine is built, with a :class:`CommandError`."""
    port = options.get("metrics_port")
    if port is None:
        return
    if not 0 <= port <= 65535:
        raise CommandError(f"--metrics-port must be between 0 and 65535, got {port}")
    address = options.get("metrics_address", DEFAULT_METRICS_ADDRESS)
    if not address or address != address.strip():
        raise CommandError(
            f"--metrics-address must be an address to listen on (such as 127.0.0.1 or "
            f"0.0.0.0), got {address!r}"
        )
    try:
        socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise CommandError(f"--metrics-address {address!r} is not an address here: {exc}") from None
    try:
        from . import prometheus  # noqa: F401  (the [metrics] extra, needed only here)
    except ImportError as exc:
        raise CommandError(
            f"--metrics-port needs prometheus-client: pip install 'django-ledon[metrics]' ({exc})"
        ) from None


def engine_id_option(value: str | None, option: str, default: str) -> str | None:
    """An engine's ``--<kind>-id``: None when left out (the engine then uses
    ``default``, named in the message); an empty id, or one with spaces around it, is
    refused rather than silently replaced by the default."""
    if value is None:
        return None
    if not value.strip():
        raise CommandError(f"{option} must not be empty (leave it out for the default, {default})")
    if value != value.strip():
        raise CommandError(f"{option} must not start or end with spaces, got {value!r}")
    return value


def serve_metrics(port: int, *, out: Any, name: str, address: str = DEFAULT_METRICS_ADDRESS) -> Any:
    """Start the metrics server of ``--metrics-port`` and say where it listens."""
    check_metrics_options({"metrics_port": port, "metrics_address": address})
    from . import prometheus  # the [metrics] extra, checked just above

    try:
        server = prometheus.serve(port, address)
    except OSError as exc:
        raise CommandError(f"--metrics-address {address} --metrics-port {port}: {exc}") from None
    host = str(server.server_address[0])
    shown = f"[{host}]" if ":" in host else host
    out.write(f"{name}: metrics on http://{shown}:{server.server_port}/metrics")
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
    metrics_address: str = DEFAULT_METRICS_ADDRESS,
) -> S:
    """``run()`` (the engine's) with SIGTERM and SIGINT as stop requests; each is
    announced on ``out`` as ``"<name>: SIGTERM, <meaning of the level reached>"``.
    At the end, ``"<name> stopped: <the stats' summary>"`` on ``out`` (``style``
    applied: the command's ``self.style.SUCCESS``). With ``metrics_port``, the
    metrics are served meanwhile (:func:`serve_metrics`)."""
    server = (
        None
        if metrics_port is None
        else serve_metrics(metrics_port, out=out, name=name, address=metrics_address)
    )

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


class EngineStart(NamedTuple):
    """What an engine's command starts: the engine, its ``run``, and its name in the
    lines the command prints (``"worker host:1234"``)."""

    engine: Engine
    run: Callable[[], EngineStats]
    name: str


class EngineCommand(BaseCommand):
    """The base of every engine's management command: ``--metrics-port``, then the
    engine's own options (:meth:`add_engine_arguments`); :meth:`handle` builds the
    engine (:meth:`start`) and runs it with :func:`run_engine`. :meth:`printer` prints
    the engine's events: none at verbosity 0, :attr:`quiet_events` only from 2, never
    ``stopped`` (the summary line says it), :attr:`loud_events` in :attr:`loud_style`.

    Before it starts, the command runs the system checks tagged
    :data:`~ledon.checks.ENGINES` (the apps' own and the tasks framework's), not the
    whole project's: the admin's, the URLconf's (which imports every view) and the
    templates' concern the web side and ``manage.py check``."""

    requires_system_checks = [ENGINES]

    #: What each signal does, by the stop level it reaches.
    signal_meaning: ClassVar[Mapping[StopLevel, str]]
    #: Events printed only at verbosity 2 and above.
    quiet_events: ClassVar[frozenset[str]] = frozenset()
    #: Events printed in :attr:`loud_style` (a style of ``self.style``).
    loud_events: ClassVar[frozenset[str]] = frozenset()
    loud_style: ClassVar[str] = "WARNING"
    #: Errors raised by ``run()`` that end the command with their message alone.
    run_errors: ClassVar[tuple[type[Exception], ...]] = ()

    def run_from_argv(self, argv: list[str]) -> None:
        # The command is this process's program (not a call_command): what start-up
        # made — modules, models, settings — lives as long as the process, so the
        # garbage collector need not walk it again at every full collection, nor at
        # the exit.
        gc.freeze()
        super().run_from_argv(argv)

    def add_arguments(self, parser: CommandParser) -> None:
        add_metrics_port(parser)
        self.add_engine_arguments(parser)

    def add_engine_arguments(self, parser: CommandParser) -> None:
        """The engine's own options."""

    def start(self, options: dict[str, Any]) -> EngineStart:
        """Check the options, build the engine, say what it is about to do."""
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        # Every option is checked before the engine is built and its banner printed.
        check_metrics_options(options)
        engine, run, name = self.start(options)
        try:
            run_engine(
                engine,
                run,
                out=self.stdout,
                name=name,
                meaning=self.signal_meaning,
                style=self.style.SUCCESS,
                metrics_port=options["metrics_port"],
                metrics_address=options.get("metrics_address", DEFAULT_METRICS_ADDRESS),
            )
        except self.run_errors as exc:
            raise CommandError(str(exc)) from exc

    def describe(self, subject: Any) -> str:
        """What an event is about (a claim, an instance), in the printed line."""
        return ""

    def printer(self, verbosity: int) -> Callable[..., None]:
        """The engine's ``on_event``: ``(event, detail)`` or ``(event, subject, detail)``,
        one line each, ``"<event> <subject> <detail>"``."""
        loud = getattr(self.style, self.loud_style)

        def emit(event: str, *about: Any) -> None:
            if (
                verbosity < 1
                or event == "stopped"
                or (verbosity < 2 and event in self.quiet_events)
            ):
                return
            *subject, detail = about
            what = self.describe(subject[0]) if subject and subject[0] is not None else ""
            line = " ".join(p for p in (event, what, detail) if p)
            self.stdout.write(loud(line) if event in self.loud_events else line)
            self.stdout.flush()

        return emit
