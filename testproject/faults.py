"""Fault hooks driven by the environment, for crash tests with real processes.

``<VARIABLE>="<point>[/<step>]@<n>:<action>[:<arg>[:<count>]]"`` acts on the n-th time
this process reaches the named fault point (for the named step only, if given):

- ``kill`` sends SIGKILL to this process;
- ``block:<marker>`` touches ``marker`` and blocks for ever (the test kills the process);
- ``pause:<marker>:<release>`` touches ``marker`` and waits until ``release`` exists,
  then goes on (the test does something meanwhile: restarts the database);
- ``barrier:<dir>:<count>`` touches ``<dir>/<pid>`` and waits until ``count`` files are
  there, so that several processes meet at one point.

Each test app installs one hook under its own variable (``ORDERS_FAULT``,
``FULFILMENT_FAULT``); the points are named by the code that offers them
(``ledon.faults.fault_point``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ledon.faults import add_fault_hook


def install_from_environment(variable: str) -> None:
    """Install the hook of ``variable``. It reads the variable when a fault point is
    reached, not now: a child of the test fork server (``tests/support/forkserver.py``) sets
    Django up once for every value of it, so that a test's own fault spec (which
    names the test's own marker files) costs no set-up of its own."""
    parsed: dict[str, Any] = {}
    lock = threading.Lock()

    def hook(name: str, context: dict[str, Any]) -> None:
        spec = os.environ.get(variable)
        if not spec:
            return
        with lock:
            if parsed.get("spec") != spec:
                parsed.clear()
                parsed.update(_parse(variable, spec), spec=spec, hits=0)
            if name != parsed["point"] or (
                parsed["step"] and context.get("step") != parsed["step"]
            ):
                return
            parsed["hits"] += 1
            if parsed["hits"] != parsed["wanted"]:
                return
        action, args = parsed["action"], parsed["args"]
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "block":
            Path(args[0]).touch()
            threading.Event().wait()
        elif action == "pause":
            Path(args[0]).touch()
            release, deadline = Path(args[1]), time.monotonic() + 600
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            folder, count = Path(args[0]), int(args[1])
            (folder / str(os.getpid())).touch()
            deadline = time.monotonic() + 60
            while len(list(folder.iterdir())) < count and time.monotonic() < deadline:
                time.sleep(0.01)

    add_fault_hook(hook)


def _parse(variable: str, spec: str) -> dict[str, Any]:
    target, action, *args = spec.split(":")
    where, _, nth = target.partition("@")
    point, _, step = where.partition("/")
    if action not in ("kill", "block", "pause", "barrier"):
        raise ValueError(f"unknown {variable} action {action!r}")
    return {"point": point, "step": step, "wanted": int(nth or 1), "action": action, "args": args}
