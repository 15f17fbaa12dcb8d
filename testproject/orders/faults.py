"""A fault hook driven by the environment, for crash tests with real processes.

``ORDERS_FAULT="<point>@<n>:<action>[:<path>[:<count>]]"`` acts on the n-th time
this process reaches the named fault point:

- ``block:<marker>`` touches ``marker`` and blocks forever (the test kills the process);
- ``kill`` sends SIGKILL to this process;
- ``barrier:<dir>:<count>`` touches ``<dir>/<pid>`` and waits until ``count`` files
  are there (several processes meet at one point).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from outbox.faults import add_fault_hook


def install_from_environment() -> None:
    spec = os.environ.get("ORDERS_FAULT")
    if not spec:
        return
    target, action, *args = spec.split(":")
    point, _, nth = target.partition("@")
    wanted = int(nth or 1)
    hits = 0
    lock = threading.Lock()

    def hook(name: str, context: dict[str, Any]) -> None:
        nonlocal hits
        if name != point:
            return
        with lock:
            hits += 1
            if hits != wanted:
                return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "block":
            Path(args[0]).touch()
            threading.Event().wait()
        elif action == "barrier":
            folder, count = Path(args[0]), int(args[1])
            (folder / str(os.getpid())).touch()
            deadline = time.monotonic() + 60
            while len(list(folder.iterdir())) < count and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            raise ValueError(f"unknown ORDERS_FAULT action {action!r}")

    add_fault_hook(hook)
