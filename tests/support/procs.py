"""Helpers for tests that run real worker processes against the test database.

Children are started through the fork server (``forkserver.spawn``): real processes
of their own that skip most of the interpreter's and Django's start-up. A test of
start-up itself passes ``real=True`` for a fresh ``python manage.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from django.db import connection

from tests.support.forkserver import ForkedProcess, spawn

ROOT = Path(__file__).resolve().parents[2]


def settings_module() -> str:
    """The settings module of this test run (a child process uses the same one).
    Read from the environment: under ``override_settings`` (the ``settings``
    fixture), ``django.conf.settings.SETTINGS_MODULE`` is None."""
    return os.environ.get("DJANGO_SETTINGS_MODULE") or "testproject.settings"


def database_url() -> str:
    """The URL of the test database as the test process sees it."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or ""
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{s['HOST']}:{s['PORT']}/{s['NAME']}"


def give_children_default_sigint() -> None:
    """Give SIGINT its default action (``KeyboardInterrupt``) back in this test process
    when the run inherited it ignored, so that every child it starts has it too.

    A shell ignores SIGINT and SIGQUIT in a command it starts in the background
    without job control (``scripts/test.sh > log &`` in a script, a CI step run that
    way); an ignored signal stays ignored through fork and exec, and Python keeps it
    so at start-up. A child that the tests stop as a terminal's Ctrl-C would, and that
    sets no handler of its own (``runserver``), then never hears the signal. Called
    by ``pytest_configure``, in the main thread of each test process."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def manage(
    database: str, *args: str, env: dict[str, str] | None = None, real: bool = False
) -> None:
    """Run ``manage.py ARG …`` to its end on the database ``database`` (a URL); fail
    the test with its error output if it fails."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = spawn(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env={
                **os.environ,
                **(env or {}),
                "DJANGO_SETTINGS_MODULE": settings_module(),
                "DATABASE_URL": database,
            },
            stdout=out,
            stderr=err,
            real=real,
        )
        try:
            code = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    assert code == 0, f"manage.py {' '.join(args)[:200]}:\n{stderr[-3000:]}"


class ManageProcess:
    """``manage.py <command> …`` in a child process on the test database (or the one
    ``database`` names by URL), its output kept in a file; ``real=True``: a fresh
    interpreter, not a child of the fork server."""

    def __init__(
        self,
        tmp_path: Path,
        command: str,
        *args: str,
        env: dict[str, str] | None = None,
        database: str | None = None,
        real: bool = False,
    ) -> None:
        self.name = command
        self.log_path = tmp_path / f"{command}-{time.monotonic_ns()}.log"
        self._log: IO[str] = self.log_path.open("w")
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings_module(),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
            "DATABASE_URL": database or database_url(),
        }
        self.proc: ForkedProcess | subprocess.Popen[bytes] = spawn(
            self.argv(command, args),
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            real=real,
        )

    def argv(self, command: str, args: tuple[str, ...]) -> list[str]:
        return [sys.executable, "manage.py", command, *args]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def wait_for_output(self, text: str, timeout: float = 30) -> None:
        wait_until(lambda: text in self.output, timeout, f"{self.name} output {text!r}", self)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(
                f"{self.name} did not exit in {timeout}s:\n{self.output}"
            ) from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()


class WorkerProcess(ManageProcess):
    """``manage.py run_jobs -v 2 …`` in a child process."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        super().__init__(tmp_path, "run_jobs", "-v", "2", *args, env=env)


def wait_until(
    condition: Callable[[], Any],
    timeout: float = 30,
    what: str = "condition",
    worker: ManageProcess | None = None,
) -> Any:
    """Poll ``condition`` until it is truthy; fail after ``timeout`` seconds.

    Waiting on an observable condition with a bound is how these tests order
    events across processes — never a bare sleep that hopes something happened.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{worker.name} output:\n{worker.output}" if worker else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{extra}")
        time.sleep(0.05)
