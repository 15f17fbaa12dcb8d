"""Shared helpers of the saga tests: order data, reading the side-effect counter and
journal, and management commands in child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import IO, Any

from procs import ROOT, database_url, wait_until

from sagas.models import SagaInstance
from testproject.fulfilment.models import StepRun

#: Data of one order for the fulfilment sagas.
ORDER: dict[str, Any] = {"order_id": 7, "sku": "SKU-1", "quantity": 2, "amount": "19.90"}

#: Child processes: short leases, so that tests wait for expiry briefly.
FAST = {
    "SAGAS_LEASE_SECONDS": "1",
    "SAGAS_POLL_INTERVAL": "0.1",
    "SAGAS_COMPENSATION_RETRY_DELAY": "0",
}


def order(**extra: Any) -> dict[str, Any]:
    return {**ORDER, **extra}


def runs(instance_id: uuid.UUID, kind: str = "action") -> list[str]:
    """The committed runs of steps (or compensations) of one instance, in order."""
    return list(
        StepRun.objects.filter(instance_id=instance_id, kind=kind)
        .order_by("id")
        .values_list("step", flat=True)
    )


def journal(path: Path) -> list[tuple[str, str, str, str, int]]:
    """Lines of the fulfilment journal: (instance, step, kind, start|end, pid)."""
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(i, s, k, e, int(p)) for i, s, k, e, p in lines]


def started(path: Path, kind: str = "action") -> Counter[str]:
    """How often each step's action (or compensation) started, committed or not."""
    return Counter(s for _, s, k, e, _ in journal(path) if k == kind and e == "start")


def instance(instance_id: uuid.UUID | str | None = None) -> SagaInstance:
    if instance_id is None:
        return SagaInstance.objects.get()
    return SagaInstance.objects.get(instance_id=instance_id)


class ManageProcess:
    """``manage.py <command> …`` in a child process on the test database; output kept
    in a file."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.log_path = tmp_path / f"{args[0]}-{time.monotonic_ns()}.log"
        self._log: IO[str] = self.log_path.open("w")
        full_env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def wait_for_output(self, text: str, timeout: float = 30) -> None:
        wait_until(lambda: text in self.output, timeout, f"output {text!r}", self)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"process did not exit in {timeout}s:\n{self.output}") from None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()
