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
#: What stands for the middle of an error text too long to store.
CUT_MARK = "\n[… {count} characters cut …]\n"
#: The shortest ``limit`` an error is cut to: room for the mark and a little text.
MIN_ERROR_LENGTH = 200


def _clean(text: str) -> str:
    """Valid Unicode (a lone surrogate escaped) with NUL made visible (PostgreSQL text
    cannot hold it)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")


def _cut(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its start (a fifth of the
    room) and its end (the rest) around :data:`CUT_MARK`: the end of an error is
    where the exception itself is written, its start says where it came from."""
    if len(text) <= limit:
        return text
    widest = CUT_MARK.format(count=len(text))
    room = limit - len(widest)
    if room <= 0:
        return text[:limit]
    head = room // 5
    tail = room - head
    return text[:head] + CUT_MARK.format(count=len(text) - head - tail) + text[-tail:]


def storable_text(text: str, limit: int = MAX_ERROR_LENGTH) -> str:
    """``text`` as an error is stored: valid Unicode (a lone surrogate escaped), NUL
    made visible (PostgreSQL text cannot hold it), at most ``limit`` characters —
    a longer text keeps its start and its end, its middle cut (:data:`CUT_MARK`)."""
    return _cut(_clean(text), max(limit, MIN_ERROR_LENGTH))


def format_error(exc: BaseException, limit: int = MAX_ERROR_LENGTH) -> str:
    """Exception type, message and traceback, as stored on a failed attempt, message
    or saga instance: at most ``limit`` characters.

    The one rule for a long one: the traceback's frames are cut in their middle, and
    the exception's own lines (``Type: message``, last) keep at least half the room,
    cut in their middle only if the message alone is longer — the type and the
    start and end of the message always stay."""
    limit = max(limit, MIN_ERROR_LENGTH)
    text = _clean("".join(traceback.format_exception(exc)))
    if len(text) <= limit:
        return text
    last = _clean("".join(traceback.format_exception_only(exc)))
    if not text.endswith(last):
        return _cut(text, limit)
    frames = text[: -len(last)]
    last = _cut(last, max(limit // 2, limit - len(frames)))
    return _cut(frames, limit - len(last)) + last


def docstring_message(cls: type) -> str:
    """``cls``'s docstring as one line of text: a message, not source layout.

    Docstrings wrap and indent; the message a user reads must not carry that
    layout (a newline and four spaces in the middle of a sentence).
    """
    return " ".join((cls.__doc__ or "").split())


class DocumentedError(Exception):
    """The base of each app's root error (``JobsError``, ``OutboxError``, ``SagaError``,
    ``WorkflowError``): an error whose default message is its class docstring, on one
    line.

    Catch an app's root to handle any error of that app. Never raise the root itself:
    every situation has its precise subclass, whose docstring says what happened.
    """

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
