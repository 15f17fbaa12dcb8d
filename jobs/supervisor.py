"""``run_jobs --processes N``: one supervisor, N worker processes.

Threads share one interpreter lock, so a CPU-bound handler gets at most one CPU from a
worker however many threads it has. The supervisor runs N ordinary workers (each
``run_jobs`` with the same options and ``--concurrency`` threads) as child processes
and keeps them running:

- **ids** — child ``k`` is worker ``<id>-k`` (``<id>``: ``--worker-id``, or the
  supervisor's ``host:pid``), so each has its own row in the workers registry, and a
  child restarted under the same id recovers its predecessor's unfinished attempts at
  once;
- **signals** — SIGTERM and SIGINT reach the supervisor only (each child runs in a
  process group of its own, so a terminal's Ctrl-C is not delivered twice); each one
  is passed on to every child, whose own stop levels apply: the first stops
  gracefully within ``--shutdown-timeout``, the second cancels running handlers, the
  third stops waiting. A child whose supervisor died (``kill -9``) stops gracefully
  by itself: it reads a pipe that only the supervisor holds open;
- **restarts** — a child that exits while nothing asked it to (killed, crashed) is
  logged and started again after a back-off delay that grows while children keep
  dying young; with ``--burst`` a child that exits with status 0 is done, and the
  supervisor exits once every child is;
- **metrics** — ``--metrics-port`` is served by the supervisor alone: the children
  count into a shared directory (prometheus-client's multiprocess mode) and the
  database gauges are read at scrape time, once.

The child's entry point is this module: ``python -m jobs.supervisor`` (not for
direct use).
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import django
from django.core.management import CommandError, call_command

from ledon.backoff import Backoff

if TYPE_CHECKING:
    from .observability.supervisor_metrics import SupervisorMetrics

logger = logging.getLogger(__name__)

#: The most worker processes one supervisor runs.
MAX_PROCESSES = 64
#: A child that ran at least this long before it died starts again without delay
#: growth: its death was not a crash loop.
HEALTHY_SECONDS = 60.0
#: Seconds the children get to exit after the third signal before they are killed (a
#: worker itself exits within ``Engine.abort_timeout`` of its third signal).
ABORT_GRACE = 15.0
#: Exit status of a child that refused to start (bad options, a database without the
#: app's tables): starting it again would fail the same way, so it is not restarted.
EXIT_REFUSED = 78
#: Options of ``run_jobs`` that belong to the supervisor, never passed to a child.
SUPERVISOR_OPTIONS = frozenset({"processes", "metrics_port", "worker_id"})

#: Where the supervisor's lines go: ``write(line)`` (a command's ``self.stdout``).
Writer = Callable[[str], None]


@dataclass(slots=True)
class SupervisorStats:
    """What :meth:`Supervisor.run` returns."""

    started: int = 0
    restarted: int = 0
    #: A child refused to start (its error is in the output): the run failed.
    refused: bool = False
    exit_codes: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        codes = ", ".join(f"{wid}: {code}" for wid, code in sorted(self.exit_codes.items()))
        return f"{self.started} processes started, {self.restarted} restarted; exit codes {codes}"


@dataclass(slots=True)
class _Child:
    """One slot of the supervisor: its worker id, its process while one runs, when
    it may start again after a death, and its back-off."""

    worker_id: str
    backoff: Backoff
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    done: bool = False


class Supervisor:
    """Runs ``processes`` workers (``run_jobs`` with ``worker_options``) as child
    processes until they are all done; :meth:`run` in the main thread (it owns the
    signals), :meth:`stop` from anywhere (one call: one signal's worth)."""

    def __init__(
        self,
        *,
        processes: int,
        worker_id: str,
        worker_options: Mapping[str, Any],
        burst: bool = False,
        metrics_port: int | None = None,
        write: Writer = print,
        backoff: Callable[[], Backoff] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= processes <= MAX_PROCESSES:
            raise ValueError(f"processes must be between 1 and {MAX_PROCESSES}")
        self.processes = processes
        self.worker_id = worker_id
        self.worker_options = dict(worker_options)
        self.burst = burst
        self.metrics_port = metrics_port
        self.write = write
        self.clock = clock
        new_backoff = backoff or (lambda: Backoff(base=0.5, factor=2.0, cap=30.0))
        self.children = [
            _Child(worker_id=f"{worker_id}-{k}", backoff=new_backoff())
            for k in range(1, processes + 1)
        ]
        self.stats = SupervisorStats()
        self.signals_received = 0
        self._abort_deadline: float | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        #: Held open by the supervisor only; a child stops when it reads end-of-file.
        self._life_r, self._life_w = os.pipe()
        self.metrics: SupervisorMetrics | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, write: Writer) -> Supervisor:
        """The supervisor of ``run_jobs --processes`` (its parsed ``options``): the
        supervisor's own options checked, the rest passed on to every child.
        Raises ``ValueError`` (or a jobs error for a bad id) for a bad option."""
        # Imported here: this module is also the children's entry point, which must
        # not touch the apps' modules before ``django.setup()``.
        from . import execution, validation

        processes = options["processes"]
        if not 1 <= processes <= MAX_PROCESSES:
            raise ValueError(f"--processes must be between 1 and {MAX_PROCESSES}")
        port = options.get("metrics_port")
        if port is not None and not 0 <= port <= 65535:
            raise ValueError("--metrics-port must be between 0 and 65535")
        worker_id = options.get("worker_id") or execution.default_worker_id()
        # The longest child id must be a valid worker id too.
        validation.text(f"{worker_id}-{processes}", "worker id", validation.MAX_NAME_LENGTH)
        unpassed = SUPERVISOR_OPTIONS | {"stdout", "stderr"}
        return cls(
            processes=processes,
            worker_id=worker_id,
            worker_options={k: v for k, v in options.items() if k not in unpassed},
            burst=bool(options.get("burst")),
            metrics_port=port,
            write=write,
        )

    # ------------------------------------------------------------------ public

    def run(self) -> SupervisorStats:
        """Start the children, keep them running, pass signals on; return once every
        child has exited and none is to be restarted."""
        previous = {
            signum: signal.signal(signum, _note_signal)
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
        }
        old_wakeup = signal.set_wakeup_fd(self._wake_w)
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            self._start_metrics()
            for child in self.children:
                self._spawn(child)
            while not all(child.done for child in self.children):
                for _key, _events in selector.select(self._next_timeout()):
                    self._read_wakeups()
                self._reap()
                self._restart_due()
                self._kill_after_abort()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            selector.close()
            self._close()
        return self.stats

    def stop(self) -> None:
        """One stop request, as a SIGTERM would be: passed on to every child."""
        os.write(self._wake_w, bytes([signal.SIGTERM]))

    # ------------------------------------------------------------------ children

    def _spawn(self, child: _Child) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        if self.metrics is not None:
            env["PROMETHEUS_MULTIPROC_DIR"] = self.metrics.directory
        options = {**self.worker_options, "worker_id": child.worker_id, "skip_checks": True}
        argv = [
            sys.executable,
            "-m",
            "jobs.supervisor",
            str(self._life_r),
            json.dumps({"options": options, "metrics": self.metrics is not None}),
        ]
        child.process = subprocess.Popen(argv, env=env, pass_fds=(self._life_r,), process_group=0)
        child.started_at = self.clock()
        child.restart_at = None
        self.stats.started += 1
        logger.info(
            "worker %s started (pid %s)",
            child.worker_id,
            child.process.pid,
            extra={"worker": child.worker_id, "pid": child.process.pid},
        )

    def _reap(self) -> None:
        for child in self.children:
            if child.process is None or child.process.poll() is None:
                continue
            code = child.process.returncode
            pid = child.process.pid
            child.process = None
            self.stats.exit_codes[child.worker_id] = code
            if self.metrics is not None:
                self.metrics.forget(pid)
            if self.signals_received or (self.burst and code == 0):
                child.done = True
                continue
            if code == EXIT_REFUSED:
                child.done = True
                self.stats.refused = True
                logger.error(
                    "worker %s refused to start; not restarting it",
                    child.worker_id,
                    extra={"worker": child.worker_id},
                )
                continue
            lived = self.clock() - child.started_at
            if lived >= HEALTHY_SECONDS:
                child.backoff.reset()
            delay = child.backoff.next_delay()
            child.restart_at = self.clock() + delay
            how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
            logger.warning(
                "worker %s (pid %s) %s; restarting it in %.1f s",
                child.worker_id,
                pid,
                how,
                delay,
                extra={"worker": child.worker_id, "pid": pid, "exit_code": code},
            )
            self.write(f"worker {child.worker_id} (pid {pid}) {how}; restarting in {delay:.1f} s")

    def _restart_due(self) -> None:
        now = self.clock()
        for child in self.children:
            if child.restart_at is not None and now >= child.restart_at and not child.done:
                self.stats.restarted += 1
                self._spawn(child)

    def _next_timeout(self) -> float | None:
        due = [c.restart_at for c in self.children if c.restart_at is not None]
        if self._abort_deadline is not None:
            due.append(self._abort_deadline)
        if not due:
            return None
        return max(0.0, min(due) - self.clock())

    # ------------------------------------------------------------------ signals

    def _read_wakeups(self) -> None:
        try:
            data = os.read(self._wake_r, 512)
        except BlockingIOError:
            return
        for signum in data:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self._pass_on(signal.Signals(signum))

    def _pass_on(self, signum: signal.Signals) -> None:
        self.signals_received += 1
        level = ("stopping gracefully", "cancelling running handlers", "no more waiting")
        what = level[min(self.signals_received, 3) - 1]
        self.write(f"supervisor {self.worker_id}: {signum.name}, {what} in every worker")
        for child in self.children:
            child.restart_at = None  # a child waiting for its restart is done
            if child.process is None:
                child.done = True
                continue
            child.process.send_signal(signum)  # an exited child is reaped next turn
        if self.signals_received >= 3 and self._abort_deadline is None:
            self._abort_deadline = self.clock() + ABORT_GRACE

    def _kill_after_abort(self) -> None:
        if self._abort_deadline is None or self.clock() < self._abort_deadline:
            return
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                logger.error(
                    "worker %s did not exit after its third signal: killing it",
                    child.worker_id,
                    extra={"worker": child.worker_id},
                )
                child.process.kill()

    # ------------------------------------------------------------------ metrics

    def _start_metrics(self) -> None:
        if self.metrics_port is None:
            return
        # An optional layer (the [metrics] extra): loaded only for --metrics-port.
        from .observability.supervisor_metrics import SupervisorMetrics

        self.metrics = SupervisorMetrics(self.metrics_port)
        self.write(
            f"supervisor {self.worker_id}: metrics on "
            f"http://0.0.0.0:{self.metrics.port}/metrics (every worker's)"
        )

    def _close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        for fd in (self._wake_r, self._wake_w, self._life_r, self._life_w):
            os.close(fd)


def _note_signal(signum: int, frame: Any) -> None:
    """Nothing: the wake-up pipe carries the signal to :meth:`Supervisor.run`."""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ---------------------------------------------------------------------- the child


def _stop_when_orphaned(life_fd: int) -> None:
    """Stop this worker gracefully once the supervisor is gone: the pipe's write end
    lives in the supervisor only, so end-of-file means it exited or was killed."""

    def watch() -> None:
        with os.fdopen(life_fd, "rb", buffering=0) as life:
            life.read()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def child_main(argv: list[str]) -> None:
    """A worker process of the supervisor: ``run_jobs`` with the supervisor's options."""
    life_fd, spec = int(argv[0]), json.loads(argv[1])
    django.setup()
    if spec["metrics"]:
        # An optional layer (the [metrics] extra), and it reads the apps: after setup.
        from .observability.supervisor_metrics import enable_in_child

        enable_in_child()
    _stop_when_orphaned(life_fd)
    try:
        call_command("run_jobs", **spec["options"])
    except CommandError as exc:
        sys.stderr.write(f"worker {spec['options']['worker_id']}: {exc}\n")
        sys.exit(EXIT_REFUSED)


if __name__ == "__main__":
    child_main(sys.argv[1:])
