"""Sending Django's task signals so that a failing receiver cannot change a task.

``send_robust`` is used: a receiver that raises is logged and the others still run.
A broken receiver must neither make a committed enqueue look failed nor fail (and
so re-run) a task whose function succeeded.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal
from django.tasks import TaskResult

logger = logging.getLogger(__name__)


def send_signal(signal: Signal, sender: type[Any], result: TaskResult[Any, Any]) -> None:
    for receiver, response in signal.send_robust(sender=sender, task_result=result):
        if isinstance(response, Exception):
            logger.error(
                "a receiver of a task signal failed: %r",
                receiver,
                exc_info=response,
                extra={"task_result_id": result.id},
            )
