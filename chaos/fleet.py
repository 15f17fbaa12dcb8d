"""The processes of a chaos run: the PostgreSQL cluster, and each engine (and the
feeder) behind a loopback fault proxy of its own, started again after each fault
that ends it."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster
from tests.support.procs import ManageProcess, manage
from tests.support.proxy import FaultProxy

from .profiles import Profile

#: A line an engine prints when an outage of its database begins.
OUTAGE = "database unreachable"


def engine_env(profile: Profile, transport: dict[str, str]) -> dict[str, str]:
    """The settings every process of a run gets (``testproject/settings.py`` reads them
    from the environment): short leases and deadline, statements not prepared (so that
    the proxy sees each one's text), sagas driven by ``recover_sagas`` only."""
    lease = str(profile.lease)
    return {
        "JOBS_LEASE_SECONDS": str(int(profile.lease)),
        "JOBS_HEARTBEAT_SECONDS": "1",
        "JOBS_RECOVERY_INTERVAL": "1",
        "JOBS_SCHEDULER": "false",
        "JOBS_PREPARED_STATEMENTS": "false",
        "OUTBOX_ENABLED": "true",
        "OUTBOX_LEASE_SECONDS": lease,
        "OUTBOX_RECOVERY_INTERVAL": "1",
        "OUTBOX_RETRY_BASE_DELAY": "0.2",
        "OUTBOX_BATCH_SIZE": "20",
        "SAGAS_LEASE_SECONDS": lease,
        "SAGAS_POLL_INTERVAL": "0.2",
        "SAGAS_RECOVER_IN_WORKER": "false",
        "LEDON_ROUND_TRIP_DEADLINE": str(profile.deadline),
        **transport,
    }


def rabbitmq_env(url: str) -> dict[str, str]:
    """The outbox's transport over RabbitMQ at ``url``, on an exchange of this run."""
    options = {"exchange": f"chaos-{uuid.uuid4().hex[:8]}", "connect_timeout": 2}
    return {
        "OUTBOX_TRANSPORT": "rabbitmq",
        "RABBITMQ_URL": url,
        "OUTBOX_TRANSPORT_OPTIONS": json.dumps(options),
    }


@dataclass
class Process:
    """One engine (or the feeder): its command, and every OS process started for it."""

    name: str
    role: str
    command: str
    args: tuple[str, ...]
    proxy: FaultProxy
    fleet: Fleet
    runs: list[ManageProcess] = field(default_factory=list)
    #: Exit statuses of the runs that ended, with how they were ended.
    exits: list[tuple[str, int]] = field(default_factory=list)

    @property
    def current(self) -> ManageProcess:
        return self.runs[-1]

    @property
    def output(self) -> str:
        return self.current.output

    def start(self, env: dict[str, str] | None = None) -> ManageProcess:
        proc = ManageProcess(
            self.fleet.log_dir,
            self.command,
            *self.args,
            env={**self.fleet.env, **(env or {})},
            # Persistent connections, as long-running engines are deployed with (else
            # the consumer opens one per message).
            database=self.proxy.url(self.fleet.cluster.url) + "?conn_max_age=600",
        )
        self.runs.append(proc)
        return proc

    def alive(self) -> bool:
        return bool(self.runs) and self.current.proc.poll() is None

    def kill(self) -> None:
        self.current.proc.send_signal(signal.SIGKILL)
        self.exits.append(("SIGKILL", self.current.proc.wait(timeout=60)))

    def terminate(self, timeout: float = 90) -> int:
        """SIGTERM, and the exit status (or -1 if it did not exit in ``timeout``)."""
        self.current.proc.send_signal(signal.SIGTERM)
        try:
            code = self.current.proc.wait(timeout=timeout)
        except Exception:
            self.current.proc.send_signal(signal.SIGKILL)
            self.current.proc.wait(timeout=60)
            code = -1
        self.exits.append(("SIGTERM", code))
        return code

    def wait_for(self, condition: Callable[[], Any], what: str, timeout: float = 120) -> Any:
        """Poll ``condition`` until true; fail (naming this process and showing the end
        of its output) after ``timeout`` seconds or if the process ended first."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if not self.alive():
                raise FleetError(f"{self.name} ended while waiting for {what}", self)
            if time.monotonic() > deadline:
                raise FleetError(f"timed out after {timeout:.0f} s waiting for {what}", self)
            time.sleep(0.05)

    def wait_started(self, timeout: float = 120) -> None:
        """Wait until the current run is at work (a consumer says "ready")."""
        run, text = self.current, "ready " if self.role == "consumer" else "started"
        self.wait_for(lambda: text in run.output, f"{self.name} to start", timeout)

    def outages(self) -> int:
        return self.output.count(OUTAGE)


class FleetError(AssertionError):
    def __init__(self, message: str, process: Process | None = None) -> None:
        tail = f"\n--- {process.name} output (end):\n{process.output[-4000:]}" if process else ""
        super().__init__(message + tail)


class Fleet:
    """The cluster and the processes of one run."""

    def __init__(self, profile: Profile, log_dir: Path, transport: dict[str, str]) -> None:
        self.profile = profile
        self.log_dir = log_dir
        self.env = engine_env(profile, transport)
        self.broker = transport.get("OUTBOX_TRANSPORT") == "rabbitmq"
        self.cluster = Cluster(synchronous_commit=True)
        self.processes: dict[str, Process] = {}
        self._proxies: list[FaultProxy] = []

    def migrate(self) -> None:
        manage(self.cluster.url, "migrate", "-v", "0", env=self.env)

    def add(self, name: str, role: str, command: str, *args: str) -> Process:
        proxy = FaultProxy(self.cluster.port).start()
        self._proxies.append(proxy)
        process = Process(name, role, command, args, proxy, self)
        self.processes[name] = process
        return process

    def roles(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for process in self.processes.values():
            found.setdefault(process.role, []).append(process.name)
        return found

    def build(self) -> None:
        """The engines of the profile (not started)."""
        p = self.profile
        for n in range(1, p.workers + 1):
            self.add(
                f"w{n}", "worker", "run_jobs", "--worker-id", f"w{n}",
                "--concurrency", str(p.concurrency), "--shutdown-timeout", "5",
            )  # fmt: skip
        for n in range(1, p.dispatchers + 1):
            self.add(f"d{n}", "dispatcher", "dispatch_outbox", "--dispatcher-id", f"d{n}")
        if self.broker:
            self.add("c1", "consumer", "consume_events", "--group", "chaos-billing")
        for n in range(1, p.saga_runners + 1):
            self.add(f"r{n}", "saga runner", "recover_sagas", "--runner-id", f"r{n}")

    def engines(self) -> list[Process]:
        return [p for p in self.processes.values() if p.role != "feeder"]

    def start_engines(self) -> None:
        for process in self.engines():
            process.start()
        for process in self.engines():
            process.wait_started()

    def check_alive(self) -> None:
        """Fail if a process ended that no fault ended."""
        for process in self.processes.values():
            if process.runs and not process.alive() and process.role != "feeder":
                raise FleetError(f"{process.name} ended on its own", process)

    def value(self, query: str, params: Any = None) -> Any:
        return self.cluster.value(query, params)

    def close(self) -> None:
        for process in self.processes.values():
            for run in process.runs:
                run.close()
        for proxy in self._proxies:
            proxy.close()
        self.cluster.stop()

    def dropped_replies(self) -> int:
        return sum(proxy.stats.replies_dropped for proxy in self._proxies)


def acknowledged(feeder: Process) -> int:
    """How many units the feeder acknowledged (its output's last ``acknowledged N``)."""
    found = re.findall(r"^acknowledged (\d+) ", feeder.output, re.MULTILINE)
    return int(found[-1]) + 1 if found else 0


def rabbitmq_available() -> bool:
    return os.path.exists("/usr/lib/rabbitmq/bin/rabbitmq-server")
