"""Sending Django's task signals so that a failing receiver cannot change a task.

Sent through :func:`jobs.signals.send_logged`: a receiver that raises is logged and
the others still run.
A broken receiver must neither make a committed enqueue look failed nor fail (and
so re-run) a task whose function succeeded.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from ..signals import send_logged
from .compat import TaskResult

logger = logging.getLogger(__name__)


def send_signal(signal: Signal, sender: type[Any], result: TaskResult[Any, Any]) -> None:
    send_logged(
        signal,
        sender,
        "a task signal",
        log=logger,
        extra={"task_result_id": result.id},
        task_result=result,
    )
