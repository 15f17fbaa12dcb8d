"""Signals of the job worker, for apps that run beside it in every ``run_jobs``
process (``sagas`` recovers unfinished saga instances there, SPEC S5).

Both are sent with ``sender=Worker`` and ``worker=<the Worker>``. A receiver that
raises is logged and does not stop the worker.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

#: A worker has started: its start-up recovery is done, it is about to claim jobs.
worker_started = Signal()

#: A worker is stopping: its handlers have ended (or were re-queued). Receivers stop
#: what they started for it; in ``burst`` mode they may first let it finish.
worker_stopping = Signal()


def send_logged(
    signal: Signal,
    sender: Any,
    what: str,
    *,
    log: logging.Logger = logger,
    extra: dict[str, Any] | None = None,
    **named: Any,
) -> None:
    """Send ``signal`` robustly: a receiver that raises is logged to ``log`` (naming
    ``what``) and the other receivers still run; the sender goes on either way."""
    for receiver, response in signal.send_robust(sender=sender, **named):
        if isinstance(response, Exception):
            log.error("a receiver of %s failed: %r", what, receiver, exc_info=response, extra=extra)
