"""Errors: the root of each app's errors (the class docstring is the default
message), the one way an exception becomes the error text that is stored, and
sending the apps' signals so that a receiver that fails never stops the sender."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

#: The longest error text any app stores (an attempt's, a message's, an instance's).
MAX_ERROR_LENGTH = 100_000


def storable_text(text: str, limit: int = MAX_ERROR_LENGTH) -> str:
    """``text`` as an error is stored: valid Unicode (a lone surrogate escaped), NUL
    made visible (PostgreSQL text cannot hold it), at most ``limit`` characters."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")[:limit]


def format_error(exc: BaseException, limit: int = MAX_ERROR_LENGTH) -> str:
    """Exception type, message and traceback, as stored on a failed attempt, message
    or saga instance."""
    return storable_text("".join(traceback.format_exception(exc)), limit)


def docstring_message(cls: type) -> str:
    """``cls``'s docstring as one line of text: a message, not source layout.

    Docstrings wrap and indent; the message a user reads must not carry that
    layout (a newline and four spaces in the middle of a sentence).
    """
    return " ".join((cls.__doc__ or "").split())


class DocumentedError(Exception):
    """An error whose default message is its class docstring, on one line."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or docstring_message(type(self)))


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
