"""A statement log for the tests and benchmarks of the schedules: with
``STATEMENT_LOG=<file>``, every statement any connection of this process runs through
Django appends one line — time, thread name, the statement's first words — so that a
test can count what a worker's scheduler thread issued while it slept.

It wraps Django's cursors (``connection.execute_wrappers``), so it sees every
statement of the ORM and of the stores' ``connection.cursor()`` calls; statements the
job store runs as PostgreSQL prepared statements on the raw connection (the worker's
claim, with ``JOBS["PREPARED_STATEMENTS"]``) bypass it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db.backends.signals import connection_created

_lock = threading.Lock()


def install_from_environment(variable: str) -> None:
    path = os.environ.get(variable)
    if not path:
        return
    log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (open for the process)

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        words = " ".join(str(sql).split())[:1000]
        with _lock:
            log.write(f"{time.time():.6f}\t{threading.current_thread().name}\t{words}\n")
        return execute(sql, params, many, context)

    def add(sender: Any, connection: Any, **kwargs: Any) -> None:
        if record not in connection.execute_wrappers:
            connection.execute_wrappers.append(record)

    connection_created.connect(add, weak=False, dispatch_uid="timetable.statement_log")
