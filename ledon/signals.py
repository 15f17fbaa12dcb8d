"""Sending the apps' signals so that a receiver that fails never stops the sender."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)


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
